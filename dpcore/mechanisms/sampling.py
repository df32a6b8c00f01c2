"""Samplers whose distribution is exactly what the accountants assume, and the fused
gather-and-sum that mixes the rows they pick."""

from __future__ import annotations

import math

import numpy as np
import torch

from dpcore.mechanisms import binomial, float_error
from dpcore.mechanisms.secure_random import SecureRandom

# Entries a chunk holds at once (its indices, its output rows and the block partial sums of
# ``gather_sum``): bounds memory at a few hundred MB.
GATHER_BUDGET = 1 << 25
# ``gather_sum`` on float32 rows sums blocks of this many rows in float32, then the block sums
# in float64: float32 speed (half the bytes of a float64 copy; smaller blocks measured slower,
# docs/results/implementation.md), a rounding bound that stops growing with ℓ at γ_64 in float32
# (``float_error.blocked_sum``).
SUM_BLOCK = 64
_CPU = torch.device("cpu")


def subset_path(n: int, size: int) -> str:
    """Which exact sampler ``uniform_subsets`` uses, from public (n, ℓ): ``distinct`` draws
    while 8ℓ ≤ n (a fresh draw collides with probability ≤ 1/8: few, cheap rounds),
    ``complement`` (distinct draws of the n − ℓ excluded) while 8(n − ℓ) ≤ n, else ``keys``
    (n sort keys per subset, O(n) = O(ℓ) there: distinct draws near ℓ = n/2 need about
    log₂ ℓ rounds of sorting and measured several times slower than the keys)."""
    if 8 * size <= n:
        return "distinct"
    if 8 * (n - size) <= n:
        return "complement"
    return "keys"


def chunk_size(*, mixture_degree: int, dim: int, n: int) -> int:
    """Rows per chunk of a mechanism that mixes ``mixture_degree`` of ``n`` records of ``dim``
    entries: the chunk's indices (ℓ per row, n sort keys on the ``keys`` path, where n < 8ℓ),
    its float64 output row and ``gather_sum``'s block partial sums (⌈ℓ/64⌉ rows of ``dim``, in
    float32 and a float64 copy) stay within ``GATHER_BUDGET`` entries. Public sizes only."""
    blocks = -(-mixture_degree // SUM_BLOCK)
    keys = n if subset_path(n, mixture_degree) == "keys" else 0
    per_row = mixture_degree + keys + dim * (1 + 2 * blocks)
    return max(1, min(4096, GATHER_BUDGET // max(1, per_row)))


def uniform_subsets(
    n: int, size: int, count: int, *, generator: SecureRandom, device: torch.device
) -> torch.Tensor:
    """``count`` independent subsets of ``size`` distinct indices from range(n), each exactly
    uniform, as an int64 (count, size) tensor on ``device``; O(ℓ) expected draws per subset
    and O(ℓ log ℓ) expected work, for every ℓ ≤ n. Three exact paths (``subset_path``):

    ``distinct`` (8ℓ ≤ n, ``distinct_draws``): draw ℓ indices with replacement (exact uniform
    integers), then repeatedly redraw only the positions that repeat a value held at an
    earlier position of their row, until every row is distinct. Every position is uniform.

    ``complement`` (8(n − ℓ) ≤ n): the n − ℓ excluded indices are drawn so, and the row is
    their complement, in increasing order (ℓ = n: every row is range(n)). A set's complement
    is uniform when the set is.

    ``keys`` (otherwise, so n < 8ℓ and n keys cost O(ℓ)): ``_by_keys``, the ℓ smallest of n
    i.i.d. uniform 32-bit keys, rows tying at the boundary redrawn.
    """
    if not 1 <= size <= n:
        raise ValueError(f"subset size must be in [1, {n}], got {size}")
    path = subset_path(n, size)
    if path == "keys":
        return _by_keys(n, size, count, generator, device)
    if path == "distinct":
        return torch.from_numpy(distinct_draws(n, size, count, generator=generator)).to(device)
    excluded = distinct_draws(n, n - size, count, generator=generator)
    keep = np.ones((count, n), dtype=bool)
    np.put_along_axis(keep, excluded, False, axis=1)
    out = np.nonzero(keep)[1].reshape(count, size)
    return torch.from_numpy(out).to(device)


def distinct_draws(n: int, size: int, count: int, *, generator: SecureRandom) -> np.ndarray:
    """``count`` rows of ``size`` distinct indices from range(n) (int64 numpy), each row's set
    exactly uniform and the rows independent.

    Procedure: fill the (count, size) array with i.i.d. uniform draws; then, in rounds, sort
    each unfinished row by (value, position), mark every entry whose value equals that of the
    entry before it (so the earliest position of each repeated value stays, the later ones are
    marked), and give the marked positions fresh i.i.d. uniform draws; rows with no mark are
    done. Only rows that received a draw are sorted again.

    Exactness. Read the rounds as a Markov chain on the array: the positions redrawn depend
    only on each row's equality pattern (which positions hold equal values) and on positions,
    never on the values themselves, and the fresh values are i.i.d. uniform on range(n),
    independent of the past (which fresh draw lands at which marked position is immaterial:
    they are i.i.d.). For any permutations π_1, …, π_count of range(n) applied row-wise, the
    equality patterns are unchanged and the uniform law is invariant, so the chain's kernel
    and its initial law commute with (π_r); so does the law of the absorbed array. Its rows
    are ``size``-subsets, and the product of the symmetric groups acts transitively on tuples
    of ``size``-subsets, so the only invariant law is the uniform one on tuples: each row
    uniform, the rows independent. For the same reason each position's value is uniform on
    range(n) (its law is invariant under every π).

    Work. A fresh draw collides with probability < ``size``/n ≤ 1/2, so a row takes fewer
    than 2·``size`` draws in expectation, and the marked positions shrink geometrically:
    O(log ℓ) rounds at ℓ = n/2 (``uniform_subsets`` uses it while 8ℓ ≤ n: a handful of
    rounds; two or three at ℓ = 256 of n = 60 000).
    """
    if not 0 <= size <= n:
        raise ValueError(f"need 0 <= size <= {n}, got {size}")
    if n * max(size, 1) >= 2**62:
        raise ValueError("n·size must stay below 2**62 (the sort keys are int64)")
    out = generator.integers(n, (count, size)) if size else np.empty((count, 0), np.int64)
    if size < 2:
        return out
    positions = np.arange(size, dtype=np.int64)
    rows = np.arange(count)
    while rows.size:
        keys = out[rows] * size + positions
        keys.sort(axis=1)
        values = keys // size
        repeat = values[:, 1:] == values[:, :-1]
        which, _ = np.nonzero(repeat)
        if which.size == 0:
            break
        marked = keys[:, 1:][repeat] % size
        rows = rows[which]
        out[rows, marked] = generator.integers(n, which.size)
        rows = np.unique(rows)
    return out


def _by_keys(
    n: int, size: int, count: int, generator: SecureRandom, device: torch.device
) -> torch.Tensor:
    """The ``keys`` path: the ``size`` smallest of n i.i.d. uniform 32-bit keys per row, rows
    whose ``size``-th and (``size`` + 1)-th smallest keys tie redrawn. Exact: the key vector is
    exchangeable; permuting the keys by π permutes the selected set by π and leaves the event
    "tie at the boundary" unchanged, so conditioned on no tie P(S = A) = P(S = π(A)) for every
    A, π — the uniform law (ties inside the set or beyond it do not change the set). O(n) per
    subset, which ``subset_path`` only allows where n < 8ℓ."""
    if size == n:  # the whole range: no boundary to tie at
        return generator.keys((count, n), device=device).argsort(dim=1)
    out = torch.empty((count, size), dtype=torch.int64, device=device)
    todo = torch.arange(count, device=device)
    while todo.numel():
        keys = generator.keys((todo.numel(), n), device=device)
        values, indices = keys.topk(size + 1, dim=1, largest=False, sorted=True)
        tie = values[:, size - 1] == values[:, size]
        out[todo[~tie]] = indices[~tie, :size]
        todo = todo[tie]
    return out


def floyd_subsets(
    n: int, size: int, count: int, *, generator: SecureRandom, device: torch.device
) -> torch.Tensor:
    """``floyd_indices`` as an int64 tensor on ``device``."""
    return torch.from_numpy(floyd_indices(n, size, count, generator=generator)).to(device)


def floyd_indices(n: int, size: int, count: int, *, generator: SecureRandom) -> np.ndarray:
    """``count`` independent uniform subsets of ``size`` distinct indices from range(n), by
    Floyd's algorithm (Bentley & Floyd, CACM 1987): for i = 0, …, ℓ − 1 and j_i = n − ℓ + i,
    draw t_i uniform on [0, j_i] and add t_i, or j_i when t_i is already in. Exactly ``size``
    exact-uniform draws per subset and work that does not depend on n: where n is private (a
    class size) neither reveals it (``uniform_subsets`` redraws a number of times that depends
    on n). The only n-dependence left is ``integers``' redraw of words above the largest
    multiple of j + 1 (probability < (j + 1)/2³² per draw). In numpy, as an int64
    (count, size) array: no torch operation sees n.

    The membership test "t_i already in" is evaluated for all i at once, with a fixed amount
    of work, O(ℓ log ℓ) per subset instead of the O(ℓ²) of a scan. Let S_i be the set after
    step i (S_{−1} = ∅). Every t_k (k < i) is in S_{i−1} (added at step k, or already in),
    and S_{i−1} holds besides only the j_k of steps where t_k was already in. So t_i is
    already in iff (a) t_i equals some t_k with k < i, or (b) t_i = j_k for a k < i whose t_k
    was already in, i.e. k = t_i − (n − ℓ) ∈ [0, i). (a) is read off one sort of the row by
    (value, position); (b) makes "already in" at i the OR of (a) along the chain
    i → k → k′ → … (strictly decreasing), which ⌈log₂ ℓ⌉ rounds of pointer doubling resolve
    for every chain (each has ≤ ℓ nodes). The output is exactly the scan's, draw for draw
    (``tests/unit/test_dpcda_mechanism.py`` compares them)."""
    if not 1 <= size <= n:
        raise ValueError(f"subset size must be in [1, {n}], got {size}")
    if n * size >= 2**62:
        raise ValueError("n·size must stay below 2**62 (the sort keys are int64)")
    draws = np.empty((count, size), dtype=np.int64)
    for i, j in enumerate(range(n - size, n)):
        draws[:, i] = generator.integers(j + 1, count)
    positions = np.arange(size, dtype=np.int64)
    base = (np.arange(count, dtype=np.int64) * size)[:, None]  # flat offsets of the rows
    # (a): sorted by (value, position), an entry equal to its predecessor repeats an earlier t.
    keys = draws * size + positions
    keys.sort(axis=1)
    values = keys // size
    taken = np.zeros(count * size, dtype=bool)
    taken[(keys[:, 1:] % size + base).ravel()] = (values[:, 1:] == values[:, :-1]).ravel()
    # (b): pointer i → k = t_i − (n − ℓ) where 0 ≤ k < i, else to itself (a no-op below);
    # flat indices, as 1-D gathers are the cheapest numpy has.
    k = draws - (n - size)
    pointer = (np.where((k >= 0) & (k < positions), k, positions) + base).ravel()
    for _ in range(math.ceil(math.log2(size)) if size > 1 else 0):
        taken |= taken[pointer]
        pointer = pointer[pointer]
    return np.where(taken.reshape(count, size), n - size + positions, draws)


def gather_sum(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Σ_j table[index[r, j]] for every row r, as float64 (count, d), without materialising
    the (count, ℓ, d) gather: ``embedding_bag(mode="sum")`` reads each chosen row once.

    float64 tables (and any dtype other than float32, converted once) are summed in float64.
    float32 tables are summed in float32 over blocks of ``SUM_BLOCK`` consecutive members, the
    block sums converted (exactly) to float64 and added there: ``gather_sum_error`` bounds the
    rounding. ``index`` must be on ``table.device`` (the same ops run on CUDA)."""
    count, size = index.shape
    if table.dtype not in (torch.float32, torch.float64):
        table = table.double()
    if count == 0:
        return torch.zeros((0, table.shape[1]), dtype=torch.float64, device=table.device)
    blocks = -(-size // SUM_BLOCK)
    if table.dtype == torch.float64 or blocks == 1:
        return torch.nn.functional.embedding_bag(index, table, mode="sum").double()
    if size % SUM_BLOCK == 0:  # equal blocks: the fixed-size bag kernel
        partial = torch.nn.functional.embedding_bag(index.reshape(-1, SUM_BLOCK), table, mode="sum")
    else:
        starts = torch.arange(0, size, SUM_BLOCK, device=index.device)
        offsets = (torch.arange(count, device=index.device)[:, None] * size + starts).reshape(-1)
        partial = torch.nn.functional.embedding_bag(index.reshape(-1), table, offsets, mode="sum")
    return partial.view(count, blocks, -1).double().sum(dim=1)


def gather_sum_error(
    sensitivity: float, *, terms: int, magnitude: float, dtype: torch.dtype
) -> float:
    """The ``error`` a sampler must cover for rows computed as ``gather_sum`` of ``terms``
    rows of a ``dtype`` table (total norm ≤ ``magnitude`` after the scaling), then scaled once
    in float64: ``float_error.scaled_sum`` for float64 sums, ``float_error.blocked_sum`` for
    float32 blocks of ``SUM_BLOCK`` (one block of ℓ when ℓ ≤ ``SUM_BLOCK``)."""
    if dtype != torch.float32 or terms == 1:
        return float_error.scaled_sum(sensitivity, terms=terms, magnitude=magnitude)
    return float_error.blocked_sum(
        sensitivity, terms=terms, block=min(terms, SUM_BLOCK), magnitude=magnitude
    )


def poisson_subsets(
    n: int, size: int, count: int, *, generator: SecureRandom
) -> tuple[np.ndarray, np.ndarray]:
    """``count`` independent subsets of range(n) that hold every index independently with
    probability exactly q = ``size``/n (Poisson sampling), in compressed rows: int64 numpy
    ``(members, pointers)``, row t's members ``members[pointers[t] : pointers[t + 1]]`` in
    increasing order (``pointers`` has count + 1 entries, from 0). O(ℓ) expected draws per row.

    Row t's size K_t is Binomial(n, q) (``binomial.binomial``, exact), then its members a
    uniform K_t-subset (``uniform_subsets``, exact); the rows are grouped by K_t so that each
    size is one vectorised call (in increasing K_t). Exactness: for every A ⊆ range(n),
    P(S = A) = P(K = |A|)/C(n, |A|) = q^|A|·(1 − q)^(n − |A|), the law of n independent
    Bernoulli(q) inclusions; the rows are independent, as their sizes are and, given the
    sizes, their subsets (disjoint draws). How many bytes are drawn depends on the public
    (n, ℓ, count) and on the draws only."""
    sizes = binomial.binomial(n, size, n, count, generator=generator)
    pointers = np.zeros(count + 1, dtype=np.int64)
    np.cumsum(sizes, out=pointers[1:])
    members = np.empty(int(pointers[-1]), dtype=np.int64)
    order = np.argsort(sizes, kind="stable")
    values, firsts = np.unique(sizes[order], return_index=True)
    for k, rows in zip(values.tolist(), np.split(order, firsts[1:]), strict=True):
        if k:
            subsets = uniform_subsets(n, k, rows.size, generator=generator, device=_CPU).numpy()
            subsets.sort(axis=1)
            members[(pointers[rows, None] + np.arange(k)).ravel()] = subsets.ravel()
    return members, pointers


def lazy_bernoulli(
    numerator: int, denominator: int, shape: tuple[int, ...], *, generator: SecureRandom
) -> np.ndarray:
    """Booleans, each True with probability exactly p = ``numerator``/``denominator``, from
    about one keystream byte each (``SecureRandom.bernoulli`` spends a 32-bit word).

    Each entry is [V < p] for its own V = Σ_k B_k·256⁻ᵏ, B_1, B_2, … i.i.d. uniform bytes,
    so V is uniform on [0, 1) and P(True) = p exactly. The comparison reads V's base-256
    digits lazily against p's (d_k = ⌊256·r_{k−1}/m⌋, r_k = 256·r_{k−1} mod m, r_0 = the
    numerator, m the denominator, all exact integers): B_k < d_k decides True, B_k > d_k
    False, B_k = d_k with r_k = 0 (p ends there, so V ≥ p) False, else the entry reads
    B_{k+1}. An entry is still undecided after k bytes with probability ≤ 256⁻ᵏ: about
    1 + 1/255 bytes per entry. Entries use disjoint bytes, so they are independent."""
    if not 0 <= numerator <= denominator or denominator < 1:
        raise ValueError("need 0 <= numerator <= denominator, denominator >= 1")
    size = math.prod(shape)
    if numerator == denominator:
        return np.ones(shape, dtype=bool)
    digit, remainder = divmod(256 * numerator, denominator)
    byte = generator.words(size, np.uint8)
    out = byte < digit
    todo = np.flatnonzero(byte == digit) if remainder else np.empty(0, np.intp)
    while todo.size:  # ties with p's digit so far (about 1 entry in 256 per byte)
        digit, remainder = divmod(256 * remainder, denominator)
        byte = generator.words(todo.size, np.uint8)
        out[todo[byte < digit]] = True
        todo = todo[byte == digit] if remainder else todo[:0]
    return out.reshape(shape)
