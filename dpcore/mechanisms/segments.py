"""Per-group sums of rows whose bits do not depend on the device's thread scheduling.

The secure sampler rounds each noised vector to a lattice before drawing, and its cover
(``noise.LatticePlan``) bounds how far two neighbouring datasets' vectors can be apart *after*
rounding by the record's own rows: e + g√d, d the width of one group's row. That holds only if
every group the changed record does not belong to comes out bit for bit the same on both
datasets — otherwise a last-bit difference in an unchanged group can cross a rounding boundary
and move that group by a whole lattice step g per coordinate.

``index_add_`` on a CPU adds the rows of each group one after the other, in row order: the same
members at the same positions give the same bits. On CUDA it adds with atomic operations whose
order varies from run to run, so an unchanged group's float64 sum can differ in its last bits.
``index_put_(..., accumulate=True)`` on CUDA sorts the indices (a stable radix sort) and adds
each group's rows in one thread in row order (PyTorch's ``index_put_with_sort`` kernel, the one
its deterministic mode uses for ``index_add_``): deterministic, and a group's bits depend on its
own members only. ``segment_sum`` takes that path on every device but the CPU.

Records outside every group (index −1: their class has no centre left) go to one extra row that
is dropped, so the work done is the same for every record and never depends on how many
records that is (``outside``).
"""

from __future__ import annotations

import torch


def segment_sum(
    out: torch.Tensor, index: torch.Tensor, values: torch.Tensor, *, force_sorted: bool = False
) -> torch.Tensor:
    """``out[index[i]] += values[i]`` for every row i, in place, and ``out``. Deterministic on
    every device (module docstring); ``force_sorted`` takes the non-CPU path on the CPU too
    (tests)."""
    if out.device.type == "cpu" and not force_sorted:
        return out.index_add_(0, index, values)
    return out.index_put_((index,), values, accumulate=True)


def outside(index: torch.Tensor, groups: int) -> torch.Tensor:
    """``index`` with every −1 (no group) sent to the extra row ``groups`` that callers allocate
    and drop before anything is noised: every record is added somewhere, whatever its group."""
    return torch.where(index >= 0, index, torch.full_like(index, groups))
