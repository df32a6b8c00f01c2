"""Small parsed datasets for tests: what the service's parser would give for numeric features
declared in [0, 1] and integer classes 0, …, n_classes − 1 (all declared)."""

from __future__ import annotations

import numpy as np

from service.datasets.parsing import ParsedDataset


def unit_dataset(X: np.ndarray, labels: np.ndarray, n_classes: int) -> ParsedDataset:
    d = X.shape[1]
    return ParsedDataset(
        X=X,
        feature_shape=(d,),
        feature_names=[f"f{i}" for i in range(d)],
        labels=labels,
        classes=list(range(n_classes)),
        classes_declared=True,
        lo=np.zeros(d),
        hi=np.ones(d),
        clipped_values=0,
    )
