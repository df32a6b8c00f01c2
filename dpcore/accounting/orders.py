"""The one fixed grid of Rényi orders on which every ledger entry stores its curve.

The grid is frozen here (it equals dp_accounting's default grid at the time of writing) because
stored curves must stay comparable when the library changes its default: composing two curves
is only meaningful order by order.
"""

from __future__ import annotations

from collections.abc import Sequence

from dp_accounting.rdp import rdp_privacy_accountant as _rdp

ORDERS: tuple[float, ...] = (
    tuple(round(1 + k / 10, 1) for k in range(1, 100))  # 1.1, 1.2, …, 10.9
    + tuple(float(a) for a in range(11, 64))
    + (128.0, 256.0, 512.0, 1024.0)
)


def epsilon_from_rdp(rdp: Sequence[float], *, delta: float) -> float:
    """ε at ``delta`` of an RDP curve on ``ORDERS``.

    Uses dp_accounting's conversion (Balle et al. 2020, Prop. 12 / Canonne–Kamath–Steinke),
    which is never worse than Mironov's ε = RDP + log(1/δ)/(α−1).
    """
    if len(rdp) != len(ORDERS):
        raise ValueError(f"an RDP curve needs {len(ORDERS)} values, got {len(rdp)}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    eps, _ = _rdp.compute_epsilon(ORDERS, rdp, delta)
    return float(eps)
