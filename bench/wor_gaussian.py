"""Speed and agreement of dpcore.accounting.wor_gaussian against dp_accounting.

Usage: python bench/wor_gaussian.py [--repeat N]

Prints one JSON line: for a few (q, z), the median wall time of one full RDP curve on
``ORDERS`` with ``rdp_wor_gaussian`` and with dp_accounting's
``_compute_rdp_sample_wor_gaussian``, and the largest relative difference between the two.
"""

from __future__ import annotations

import argparse
import json
import statistics
import timeit
import warnings

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant as dpa_rdp

from dpcore.accounting.orders import ORDERS
from dpcore.accounting.wor_gaussian import rdp_wor_gaussian

# (q, z): the ledger's typical ℓ/n with moderate noise, a small noise multiplier, and large
# noise multipliers, where dp_accounting's high-order differences are rounding noise.
CASES = [(0.0064, 1.0), (0.01, 0.5), (1e-4, 5.0), (0.1, 20.0), (0.5, 1e3)]


def _median_ms(fn: object, repeat: int) -> float:
    times = timeit.repeat(fn, number=1, repeat=repeat)  # type: ignore[arg-type]
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=30, help="runs of ours (dp_accounting: 1/6)")
    args = parser.parse_args()
    warnings.simplefilter("ignore", RuntimeWarning)
    cases = []
    worst = 0.0
    for q, z in CASES:
        ours = rdp_wor_gaussian(q, z, ORDERS)
        ref = np.asarray(dpa_rdp._compute_rdp_sample_wor_gaussian(q, z, ORDERS), dtype=float)
        if not np.array_equal(np.isinf(ours), np.isinf(ref)):
            raise SystemExit(f"inf entries differ at q={q}, z={z}")
        finite = np.isfinite(ref)
        rel = float(np.max(np.abs(ours[finite] - ref[finite]) / np.abs(ref[finite]), initial=0.0))
        worst = max(worst, rel)
        ours_ms = _median_ms(lambda q=q, z=z: rdp_wor_gaussian(q, z, ORDERS), args.repeat)
        ref_ms = _median_ms(
            lambda q=q, z=z: dpa_rdp._compute_rdp_sample_wor_gaussian(q, z, ORDERS),
            max(3, args.repeat // 6),
        )
        cases.append(
            {
                "q": q,
                "z": z,
                "ours_ms": round(ours_ms, 3),
                "dp_accounting_ms": round(ref_ms, 3),
                "speedup": round(ref_ms / ours_ms, 1),
                "max_rel_diff": rel,
            }
        )
    print(json.dumps({"orders": len(ORDERS), "cases": cases, "max_rel_diff": worst}))


if __name__ == "__main__":
    main()
