"""Records routed to their own network's weights by fixed-shape work: the chunked layout.

A batch of b records, each of one of M networks, is laid out as ``chunks`` blocks of ``chunk``
rows: each network's records fill whole blocks of their own (in batch order, the last block of
a network padded with zero rows), the unused blocks at the end are all zero rows. A layer then
runs each block through its owner's weights (one batched product of (chunks, chunk, k) by the
(chunks, k, o) gathered weights) and a layer's gradient sums are one batched product of each
block's inputs by its output gradients, added into the owner's (M, k, o) sum.

Why not one product with the M networks side by side (x through all of them, each record's
block gathered; Aᵀ·G with each record's g in its network's column block): that does M times the
arithmetic a record needs, 90 % zeros at M = 10. Why not one product per network: its shape
would be the network's batch count, a private value the time of the step would follow.

Fixed shape: ``chunks`` = ⌊(b + M·(chunk − 1))/chunk⌋ and ``chunk`` depend on b and M only
(network m needs ⌈b_m/chunk⌉ ≤ (b_m + chunk − 1)/chunk blocks, at most ``chunks`` together),
so every product, gather and sum has the same shape and the same arithmetic whatever the
assignment — only the values of the indices (which row goes where) follow it, as the gathers
of each record's own weights always did. b itself is in every shape of a step, as before.

Rounding: a record's row is computed from that record and its network's weights alone (rows of
a product do not mix); a block's padding rows hold zeros, whose products and sums are exact
zeros. A network's sum of f_i·a_i g_iᵀ is a float64 sum of its records' terms in some order
(within blocks, then over its blocks), so the bound ``float_error`` states for any order of at
most n terms holds as it did for the side-by-side product.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# Block rows: about b/(2M) rounded up to a power of two, within these bounds. Padding costs at
# most M·(chunk − 1) rows (M·chunk/2 on average); smaller blocks make more, smaller products
# and more (chunks, k, o) weight gathers and partial sums.
MIN_CHUNK = 16
MAX_CHUNK = 256


def chunk_rows(batch: int, models: int) -> int:
    """Rows a block for ``batch`` records of ``models`` networks: a function of b (already in
    every shape of a step) and M only, never of the networks' counts."""
    target = max(1, -(-batch // (2 * models)))
    return min(MAX_CHUNK, max(MIN_CHUNK, 1 << (target - 1).bit_length()))


@dataclass(frozen=True)
class Routing:
    """The chunked layout of one batch (module docstring); R = chunks·chunk padded rows."""

    slots: torch.Tensor  # (b,) int64: each record's padded row
    owners: torch.Tensor  # (chunks,) int64: each block's network (M − 1 for unused blocks)
    chunk: int
    models: int

    @property
    def chunks(self) -> int:
        return int(self.owners.shape[0])

    def spread(self, x: torch.Tensor) -> torch.Tensor:
        """(R, …) rows from the records' (b, …): each record at its slot, zeros elsewhere."""
        out = x.new_zeros((self.chunks * self.chunk, *x.shape[1:]))
        return out.index_copy(0, self.slots, x)

    def gather(self, y: torch.Tensor) -> torch.Tensor:
        """(b, …) records' rows from the padded (R, …)."""
        return y[self.slots]

    def linear(
        self, x: torch.Tensor, weights: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x_j W_{owner(j)} (+ b_{owner(j)}) for every padded row: (R, k) → (R, o)."""
        k, o = weights.shape[1], weights.shape[2]
        blocks = x.reshape(self.chunks, self.chunk, k)
        own = weights[self.owners]
        if bias is None:
            out = torch.bmm(blocks, own)
        else:
            out = torch.baddbmm(bias[self.owners][:, None, :], blocks, own)
        return out.reshape(-1, o)

    def outer_sums(self, a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        """Σ a_j g_jᵀ over each network's padded rows, (R, k) and (R, o) → (M, k, o)."""
        k, o = a.shape[1], g.shape[1]
        blocks = torch.bmm(
            a.reshape(self.chunks, self.chunk, k).transpose(1, 2),
            g.reshape(self.chunks, self.chunk, o),
        )
        return self._by_owner(blocks.reshape(self.chunks, k * o)).reshape(self.models, k, o)

    def row_sums(self, g: torch.Tensor) -> torch.Tensor:
        """Σ g_j over each network's padded rows, (R, o) → (M, o)."""
        o = g.shape[1]
        return self._by_owner(g.reshape(self.chunks, self.chunk, o).sum(1))

    def _by_owner(self, blocks: torch.Tensor) -> torch.Tensor:
        """Σ of each network's block rows, (chunks, w) → (M, w): a product by the 0/1 owner
        matrix, exact apart from the additions of one network's blocks (products by 1 and 0
        and additions of zeros are exact) and several times faster than ``index_add_``."""
        networks = torch.arange(self.models, device=blocks.device)
        owned = (networks[:, None] == self.owners[None, :]).to(blocks.dtype)
        return owned @ blocks


def route(a: torch.Tensor, models: int, chunk: int | None = None) -> Routing:
    """The chunked layout of records of networks ``a`` (b,) in [0, M): fixed-shape work (a
    (b, M) running count, (M,) and (chunks, M) comparisons)."""
    b = int(a.shape[0])
    chunk = chunk or chunk_rows(b, models)
    chunks = (b + models * (chunk - 1)) // chunk
    device = a.device
    member = (a[:, None] == torch.arange(models, device=device)).to(torch.int64)
    # Each record's rank among its network's records (batch order), and each network's blocks.
    rank = (member.cumsum(0) - member).gather(1, a[:, None])[:, 0]
    need = (member.sum(0) + (chunk - 1)) // chunk
    ends = need.cumsum(0)
    slots = (ends - need)[a] * chunk + rank
    blocks = torch.arange(chunks, device=device)
    owners = (blocks[:, None] >= ends[None, :]).sum(1).clamp_max(models - 1)
    return Routing(slots, owners, chunk, models)


def through_own(x: torch.Tensor, weights: torch.Tensor, routing: Routing) -> torch.Tensor:
    """x_i W_{a_i} for every record (b, k) → (b, o), in the chunked layout."""
    return routing.gather(routing.linear(routing.spread(x), weights))
