"""DPGM's generative networks, M of them at once (one per cluster), as plain tensors.

Every family keeps its M networks' parameters stacked (a dict of tensors whose first axis is the
network) and answers, for a batch of records of ONE network, each record's gradient norm and
the sum of the gradients clipped to a threshold — all DP-SGD needs (``dpsgd``). A record's
gradient depends on that record only (and on public parameters and public randomness), which is
what the per-record sensitivity of DP-SGD assumes.

- ``VAE`` (the default, the paper's): encoder x → h (ReLU) → (μ, log σ²) of a ``latent`` -dim
  Gaussian; decoder z → h (ReLU) → Bernoulli logits over the d features in [0, 1]. Loss per
  record: the negative ELBO (binary cross-entropy + KL), divided by d so gradient norms do not
  grow with the width of the data. Per-record gradients by ``torch.func`` (vmap of grad): no
  dependency, any architecture, and the batch's records are routed to their own network —
  Opacus would add a dependency and its own (non-secure, shuffling) data loader, and wants one
  module per optimiser. The reparametrisation noise is drawn by the caller from the release's
  secure source.
- ``RBM`` (binary units, Bernoulli visible probabilities for grey values): the gradient of the
  negative log-likelihood of a record x is −(x p(h|x)ᵀ − N_W, x − N_b, p(h|x) − N_c), with N
  the negative phase: averages over persistent Gibbs chains (PCD, Tieleman 2008), functions of
  the public parameters only. Norms and clipped sums in closed form (never a d × h tensor per
  record): ‖x pᵀ − N‖² = ‖x‖²‖p‖² − 2xᵀNp + ‖N‖².

Records reach their own network's weights through ``routing``'s chunked layout: fixed-shape
work, without running every record through all M networks.

Written here because no maintained library trains several small networks on records routed by
cluster with per-record clipping; the networks are the paper's (one hidden layer of 200).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from dpcore.mechanisms import segments
from dpcore.mechanisms.dpgm.params import network_size
from dpcore.mechanisms.dpgm.routing import Routing, route, through_own
from dpcore.mechanisms.float_error import gamma, scaled_sum
from dpcore.mechanisms.secure_random import SecureRandom

Params = dict[str, torch.Tensor]
Normal = Callable[[tuple[int, ...]], torch.Tensor]


_U = 2.0**-53  # float64's unit roundoff


def clipped_norm_excess(*, relative: float, absolute: float, clip_min: float) -> float:
    """η such that a record's gradient g scaled by f = min(1, fl(C/ñ)), ñ = fl(√max(sq, 0)) its
    computed norm, has ‖f·g‖ ≤ C·(1 + η) for every clip C ≥ ``clip_min``, when the computed
    square sq satisfies ‖g‖² ≤ (sq + ``absolute``)/(1 − ``relative``) (docs/privacy.md, DPGM,
    "Floating point"): (1 + u)·√((((1 + u)/(1 − u))² + absolute·(1 + u)²/C_min²)/(1 − relative))
    − 1, u = 2⁻⁵³, plus 16u for this expression's own rounding (a dozen operations, each
    within u of a value ≤ 2)."""
    inner = ((1 + _U) / (1 - _U)) ** 2 + absolute * (1 + _U) ** 2 / clip_min**2
    return (1 + _U) * math.sqrt(inner / (1 - relative)) - 1.0 + 16 * _U


class Family(Protocol):
    """One kind of network, M of them."""

    def names(self) -> tuple[str, ...]: ...

    def init(self, models: int, normal: Normal) -> Params: ...

    def gradients(
        self, params: Params, x: torch.Tensor, a: torch.Tensor, normal: Normal
    ) -> tuple[torch.Tensor, ClipSum]: ...

    def sample_rows(self, params: Params, models: torch.Tensor, normal: Normal) -> torch.Tensor: ...

    def rounding_error(self, n: int, clip_min: float, sensitivity: float) -> float: ...


ClipSum = Callable[[torch.Tensor], Params]
"""Given per-record factors f (min(1, C/‖g‖)), Σ_{i: a_i = m} f_i g_i for every network m and
parameter, (M, …) float64."""


def _uniform(shape: tuple[int, ...], bound: float, normal: Normal) -> torch.Tensor:
    # Gaussian init of the same variance as PyTorch's default uniform(−b, b): b/√3.
    return normal(shape) * (bound / math.sqrt(3.0))


@dataclass(frozen=True)
class VAE:
    d: int
    hidden: int
    latent: int

    def names(self) -> tuple[str, ...]:
        return (
            "enc_w",
            "enc_b",
            "mu_w",
            "mu_b",
            "lv_w",
            "lv_b",
            "dec_w1",
            "dec_b1",
            "dec_w2",
            "dec_b2",
        )

    def init(self, models: int, normal: Normal) -> Params:
        d, h, z = self.d, self.hidden, self.latent
        shapes = {
            "enc_w": (d, h),
            "enc_b": (h,),
            "mu_w": (h, z),
            "mu_b": (z,),
            "lv_w": (h, z),
            "lv_b": (z,),
            "dec_w1": (z, h),
            "dec_b1": (h,),
            "dec_w2": (h, d),
            "dec_b2": (d,),
        }
        fan_in = {"enc": d, "mu": h, "lv": h, "dec_w1": z, "dec_b1": z, "dec_w2": h, "dec_b2": h}
        out: Params = {}
        for name, shape in shapes.items():
            key = name if name in fan_in else name.split("_")[0]
            bound = 1.0 / math.sqrt(fan_in[key])
            out[name] = _uniform((models, *shape), bound, normal).float()
        # The log-variance starts near 0 (unit posterior), as with a default init.
        return out

    # (weight, bias, the layer's input) of each linear layer, in ``forward``'s order.
    LAYERS = (
        ("enc_w", "enc_b", "x"),
        ("mu_w", "mu_b", "h"),
        ("lv_w", "lv_b", "h"),
        ("dec_w1", "dec_b1", "z"),
        ("dec_w2", "dec_b2", "hd"),
    )

    @staticmethod
    def forward(
        p: Params, x: torch.Tensor, r: Routing, eps: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[torch.Tensor]]:
        """Losses of the padded rows (R,) of ``r``'s layout (a record's row: its loss under its
        own network; a zero row's is not any record's), the layers' inputs, and the layers'
        outputs (pre-activations, ``LAYERS`` order) whose gradients are wanted: the gradient of
        the records' summed loss at output j, row i, is that row's record's alone.

        Work of fixed shape whatever the assignment (no side channel on cluster sizes): every
        layer runs each block of the layout through its owner's weights (``routing``)."""
        xs, es = r.spread(x), r.spread(eps)
        s_enc = r.linear(xs, p["enc_w"], p["enc_b"]).requires_grad_(True)
        h = torch.relu(s_enc)
        s_mu = r.linear(h, p["mu_w"], p["mu_b"])
        s_lv = r.linear(h, p["lv_w"], p["lv_b"])
        logvar = s_lv.clamp(-10.0, 10.0)
        z = s_mu + torch.exp(0.5 * logvar) * es
        s_d1 = r.linear(z, p["dec_w1"], p["dec_b1"])
        hd = torch.relu(s_d1)
        s_d2 = r.linear(hd, p["dec_w2"], p["dec_b2"])
        rec = torch.nn.functional.binary_cross_entropy_with_logits(s_d2, xs, reduction="none")
        kl = -0.5 * torch.sum(1.0 + logvar - s_mu * s_mu - torch.exp(logvar), dim=1)
        losses = (rec.sum(1) + kl) / x.shape[1]
        inputs = {"x": xs, "h": h.detach(), "z": z.detach(), "hd": hd.detach()}
        return losses, inputs, [s_enc, s_mu, s_lv, s_d1, s_d2]

    def gradients(
        self, params: Params, x: torch.Tensor, a: torch.Tensor, normal: Normal
    ) -> tuple[torch.Tensor, ClipSum]:
        """Per-record gradient norms and clipped sums without forming any record's gradient:
        a linear layer's gradient for record i is a_i δ_iᵀ (weights) and δ_i (bias), a_i its
        input and δ_i the loss's gradient at its output, so ‖·‖² = ‖a_i‖²‖δ_i‖² + ‖δ_i‖² and
        Σ f_i a_i δ_iᵀ sums outer products (the structure Opacus' per-sample hooks use for
        nn.Linear). Forming the b × P gradients (``torch.func.vmap``) cost 1.6 s a step of
        500 records here. Only the records' losses are differentiated: a zero row's δ is 0."""
        eps = normal((x.shape[0], self.latent)).to(x.dtype)
        r = route(a, params["enc_w"].shape[0])
        with torch.enable_grad():
            losses, inputs, outputs = self.forward(params, x, r, eps)
            deltas = torch.autograd.grad(r.gather(losses).sum(), outputs)
        acts = [inputs[source].double() for _, _, source in self.LAYERS]
        grads = [delta.double() for delta in deltas]
        return r.gather(_linear_norms(acts, grads)), lambda factors: _linear_sums(
            self.LAYERS, acts, grads, r.spread(factors), r
        )

    def rounding_error(self, n: int, clip_min: float, sensitivity: float) -> float:
        """The sampler's cover for a step's noised sums, in units of C (docs/privacy.md, DPGM,
        "Floating point"): each record's clipped gradient has norm ≤ 1 + η (its squared norm
        is a float64 sum of non-negative terms, relative error γ_K over K ≤ P + 16 per layer
        operations, P the parameters), so two records move the sum by Δ·(1 + η), Δ =
        ``sensitivity``; and the sums of ≤ n such rows, each element ≤ n + 4 rounded
        operations (the factor, the outer product, the additions, the division by C)."""
        K = network_size("vae", self.d, self.hidden, self.latent) + 16 * len(self.LAYERS)
        eta = clipped_norm_excess(relative=gamma(K), absolute=0.0, clip_min=clip_min)
        sums = scaled_sum(sensitivity, terms=n + 4, magnitude=n * (1.0 + eta))
        return sums + sensitivity * eta

    def sample_rows(self, params: Params, models: torch.Tensor, normal: Normal) -> torch.Tensor:
        """One row per entry of ``models``: network models[i]'s decoder mean at a latent draw
        from the prior N(0, I) (fixed-shape work whatever the networks drawn)."""
        z = normal((models.shape[0], self.latent)).to(params["dec_w1"].dtype)
        r = route(models, params["dec_w1"].shape[0])
        hd = torch.relu(r.linear(r.spread(z), params["dec_w1"], params["dec_b1"]))
        return r.gather(torch.sigmoid(r.linear(hd, params["dec_w2"], params["dec_b2"])))


@dataclass
class RBM:
    d: int
    hidden: int
    chains: int = 64
    # Gibbs sweeps from noise before a sample is read (post-processing of the weights).
    burn_in: int = 200
    state: torch.Tensor | None = None  # persistent chains (M, chains, d)

    def names(self) -> tuple[str, ...]:
        return ("W", "b", "c")

    def init(self, models: int, normal: Normal) -> Params:
        # The paper: W ~ N(0, 0.01²), biases 0.
        w = (0.01 * normal((models, self.d, self.hidden))).float()
        zeros = torch.zeros
        return {
            "W": w,
            "b": zeros((models, self.d), dtype=w.dtype, device=w.device),
            "c": zeros((models, self.hidden), dtype=w.dtype, device=w.device),
        }

    @staticmethod
    def _bernoulli(p: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
        return (uniform < p).to(p.dtype)

    def _gibbs(
        self,
        p: Params,
        model: int,
        v: torch.Tensor,
        uniform: Callable[[tuple[int, ...]], torch.Tensor],
    ) -> torch.Tensor:
        W, b, c = p["W"][model], p["b"][model], p["c"][model]
        h = self._bernoulli(torch.sigmoid(v @ W + c), uniform((v.shape[0], self.hidden)))
        return self._bernoulli(torch.sigmoid(h @ W.T + b), uniform((v.shape[0], self.d)))

    def advance(
        self, params: Params, model: int, uniform: Callable[[tuple[int, ...]], torch.Tensor]
    ) -> None:
        """One Gibbs sweep of network ``model``'s persistent chains (public: reads weights)."""
        assert self.state is not None
        self.state[model] = self._gibbs(params, model, self.state[model], uniform)

    def gradients(
        self, params: Params, x: torch.Tensor, a: torch.Tensor, normal: Normal
    ) -> tuple[torch.Tensor, ClipSum]:
        """Closed form (module docstring), fixed-shape work: every network's negative phase
        is computed every step, each record's hidden probabilities through all networks."""
        assert self.state is not None
        W, c = params["W"].double(), params["c"].double()
        models = W.shape[0]
        x64 = x.double()
        r = route(a, models)
        ph = torch.sigmoid(through_own(x64, W, r) + c[a])  # (b, h)
        v = self.state.double()  # (M, chains, d)
        qh = torch.sigmoid(torch.bmm(v, W) + c[:, None, :])  # (M, chains, h)
        NW = torch.bmm(v.transpose(1, 2), qh) / v.shape[1]  # (M, d, h)
        Nb, Nc = v.mean(1), qh.mean(1)  # (M, d), (M, h)
        cross = (through_own(x64, NW, r) * ph).sum(1)  # xᵀ N_W p per record
        sq_w = (x64 * x64).sum(1) * (ph * ph).sum(1) - 2.0 * cross + (NW * NW).sum((1, 2))[a]
        sq_b = ((x64 - Nb[a]) ** 2).sum(1)
        sq_c = ((ph - Nc[a]) ** 2).sum(1)
        norms = torch.sqrt((sq_w + sq_b + sq_c).clamp_min(0.0))

        def clip_sum(factors: torch.Tensor) -> Params:
            total = torch.zeros(models, dtype=torch.float64, device=x.device)
            segments.segment_sum(total, a, factors)
            fp = factors[:, None] * ph
            b_sum = torch.zeros((models, self.d), dtype=torch.float64, device=x.device)
            segments.segment_sum(b_sum, a, factors[:, None] * x64)
            c_sum = torch.zeros((models, self.hidden), dtype=torch.float64, device=x.device)
            segments.segment_sum(c_sum, a, fp)
            return {
                "W": -(r.outer_sums(r.spread(x64), r.spread(fp)) - total[:, None, None] * NW),
                "b": -(b_sum - total[:, None] * Nb),
                "c": -(c_sum - total[:, None] * Nc),
            }

        return norms, clip_sum

    def rounding_error(self, n: int, clip_min: float, sensitivity: float) -> float:
        """The sampler's cover for a step's noised sums, in units of C (docs/privacy.md, DPGM,
        "Floating point"). The squared norm is an expansion whose terms cancel: ‖x‖²‖p‖² −
        2xᵀN_W p + ‖N_W‖² + ‖x − N_b‖² + ‖p − N_c‖², every factor in [0, 1] (so ‖N_W‖²_F ≤ dh
        and |xᵀN_W p| ≤ dh), each term within γ of its own length (dh for ‖N_W‖², d + h for the
        products, d and h for the differences) of a magnitude ≤ dh, dh, d, h, and four more
        roundings of the total (≤ 4dh + d + h); each clipped gradient then has norm ≤ 1 + η.
        The sums are differences Σ f x pᵀ − (Σ f)·N_W (and likewise for b and c) of parts of
        total norm ≤ n(√(dh) + √d + √h) each, so ≤ 2n(√(dh) + √d + √h)/C_min in units of C,
        each element ≤ n + 6 rounded operations; Δ = ``sensitivity``."""
        d, h = self.d, self.hidden
        absolute = (
            gamma(d * h + 2) * d * h
            + gamma(d + h + 4) * 3 * d * h
            + gamma(d + 4) * d
            + gamma(h + 4) * h
            + gamma(4) * (4 * d * h + d + h)
        )
        eta = clipped_norm_excess(relative=0.0, absolute=absolute, clip_min=clip_min)
        parts = 2.0 * n * (math.sqrt(d * h) + math.sqrt(d) + math.sqrt(h)) / clip_min
        sums = scaled_sum(sensitivity, terms=n + 6, magnitude=parts)
        return sums + sensitivity * eta

    def sample_rows(self, params: Params, models: torch.Tensor, normal: Normal) -> torch.Tensor:
        """One row per entry of ``models``: visible probabilities of network models[i] after
        ``burn_in`` Gibbs sweeps from uniform noise. Sampled network by network (a Gibbs sweep
        through all M networks per row would cost M times as much): the work follows how many
        rows each network gets — the noisy sizes, public — not the data."""
        dtype, device = params["W"].dtype, params["W"].device
        out = torch.empty((models.shape[0], self.d), dtype=dtype, device=device)

        def uniform(shape: tuple[int, ...]) -> torch.Tensor:
            return torch.special.ndtr(normal(shape)).to(dtype)

        for model in torch.unique(models).tolist():
            where = torch.nonzero(models == model)[:, 0]
            rows = where.shape[0]
            half = torch.full((rows, self.d), 0.5, dtype=dtype, device=device)
            v = self._bernoulli(half, uniform((rows, self.d)))
            for _ in range(self.burn_in):
                v = self._gibbs(params, model, v, uniform)
            W, b, c = params["W"][model], params["b"][model], params["c"][model]
            h = self._bernoulli(torch.sigmoid(v @ W + c), uniform((rows, self.hidden)))
            out[where] = torch.sigmoid(h @ W.T + b)
        return out


def _linear_norms(acts: list[torch.Tensor], grads: list[torch.Tensor]) -> torch.Tensor:
    sq = torch.zeros(acts[0].shape[0], dtype=torch.float64, device=acts[0].device)
    for a, g in zip(acts, grads, strict=True):
        # Row norms in one pass (several times faster than the squares then a sum), as
        # accurate: a float64 sum of squares either way.
        a2 = torch.linalg.vector_norm(a, dim=1).square()
        g2 = torch.linalg.vector_norm(g, dim=1).square()
        sq = sq + a2 * g2 + g2
    return torch.sqrt(sq)


def _linear_sums(
    layers: tuple[tuple[str, str, str], ...],
    acts: list[torch.Tensor],
    grads: list[torch.Tensor],
    factors: torch.Tensor,
    r: Routing,
) -> Params:
    """Every layer's Σ f_i a_i δ_iᵀ and Σ f_i δ_i by network, from padded rows (``routing``)."""
    out: Params = {}
    for (w, b, _), a, g in zip(layers, acts, grads, strict=True):
        scaled = g * factors[:, None]
        out[w] = r.outer_sums(a, scaled)
        out[b] = r.row_sums(scaled)
    return out


def family(kind: str, d: int, hidden: int, latent: int) -> VAE | RBM:
    if kind == "vae":
        return VAE(d, hidden, latent)
    if kind == "rbm":
        return RBM(d, hidden)
    raise ValueError(f"unknown model {kind!r}")


def secure_normal(generator: SecureRandom, device: torch.device) -> Normal:
    """Standard normals from the release's secure source (float32 on ``device``)."""

    def draw(shape: tuple[int, ...]) -> torch.Tensor:
        return generator.normal(shape, device=device, dtype=torch.float32)

    return draw
