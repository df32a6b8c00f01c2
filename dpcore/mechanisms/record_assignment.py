"""DPMix's record assignment, shared by its generator and accountant and by the distributed
engine's record job (``dpcore.distributed.record``), which must release the same law: each
record joins k = ⌈Tℓ/n⌉ distinct mixtures, and a mixture (1/ℓ times the sum of its members)
moves by at most ``FEATURE_SENSITIVITY``/ℓ in features and ``LABEL_SENSITIVITY``/ℓ in labels
when one record is replaced (unit-scale records, one-hot labels:
``dpcore.accounting.per_record``). Light on purpose: the accountant imports it.
"""

from __future__ import annotations

from dpcore.accounting.per_record import FEATURE_SENSITIVITY, LABEL_SENSITIVITY

__all__ = ["FEATURE_SENSITIVITY", "LABEL_SENSITIVITY", "mixtures_per_record"]


def mixtures_per_record(*, n: int, mixture_degree: int, n_samples: int) -> int:
    """k = ⌈Tℓ/n⌉: how many mixtures each record joins under the record assignment."""
    return -(-n_samples * mixture_degree // n)
