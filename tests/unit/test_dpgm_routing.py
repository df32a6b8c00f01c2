"""DPGM's chunked layout: the same per-network sums and per-record products as the direct
computation, and the same shapes (the same work) whatever the assignment."""

from __future__ import annotations

import pytest
import torch

from dpcore.mechanisms.dpgm.routing import chunk_rows, route, through_own


def _assignments(b: int, models: int, chunk: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(b * 31 + models)
    cases = [
        torch.randint(0, models, (b,), generator=gen),
        torch.zeros(b, dtype=torch.int64),  # every record in one network
        torch.full((b,), models - 1, dtype=torch.int64),
        torch.arange(b) % models,
    ]
    # Counts at exact multiples of the block, then one past.
    exact = torch.arange(b) // chunk % models
    cases += [exact, torch.roll(exact, 1)]
    return cases


@pytest.mark.parametrize(
    ("b", "models", "chunk"), [(0, 3, 4), (1, 1, 4), (37, 5, 4), (200, 10, 16)]
)
def test_sums_and_products_match_the_direct_ones_with_fixed_shapes(
    b: int, models: int, chunk: int
) -> None:
    gen = torch.Generator().manual_seed(7)
    x = torch.rand((b, 6), generator=gen, dtype=torch.float64)
    g = torch.randn((b, 3), generator=gen, dtype=torch.float64)
    weights = torch.randn((models, 6, 3), generator=gen, dtype=torch.float64)
    shapes = set()
    for a in _assignments(b, models, chunk):
        r = route(a, models, chunk)
        shapes.add((r.chunks, tuple(r.slots.shape), tuple(r.owners.shape)))
        # Each record's slot is unique and in a block of its own network.
        assert len(set(r.slots.tolist())) == b
        assert torch.equal(r.owners[r.slots // chunk], a)
        outer = r.outer_sums(r.spread(x), r.spread(g))
        rows = r.row_sums(r.spread(g))
        for m in range(models):
            mine = a == m
            assert torch.allclose(outer[m], x[mine].T @ g[mine], rtol=1e-12, atol=1e-12)
            assert torch.allclose(rows[m], g[mine].sum(0), rtol=1e-12, atol=1e-12)
        direct = torch.bmm(x[:, None, :], weights[a])[:, 0, :]
        assert torch.allclose(through_own(x, weights, r), direct, rtol=1e-12, atol=1e-12)
    # The layout's shapes (and so every product's) depend on b and M only.
    assert len(shapes) == 1


def test_block_rows_follow_the_batch_and_the_networks_only() -> None:
    assert chunk_rows(2000, 10) == 128
    assert chunk_rows(0, 10) == 16
    assert chunk_rows(10**6, 2) == 256
