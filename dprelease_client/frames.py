"""A release artifact (NPZ, CSV or Parquet) as a pandas DataFrame; pandas and numpy are
imported only when it is called."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_release(path: Path) -> Any:
    """A release artifact file as a DataFrame, its format told by its first bytes (NPZ is a
    zip, Parquet starts ``PAR1``, else CSV), so a file named anything reads. Columns as the
    release's CSV/Parquet tables have them: the dataset's feature names, then its label
    column (the class, for mechanisms with exact labels) or ``<label>=<class>`` columns (class
    proportions, or signed values); the NPZ's metadata names them (``layout``)."""
    import pandas as pd

    with Path(path).open("rb") as fh:
        magic = fh.read(4)
    if magic == b"PAR1":
        return pd.read_parquet(path)
    if magic[:2] != b"PK":
        return pd.read_csv(path)
    import numpy as np

    with np.load(path, allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    metadata = json.loads(str(arrays["metadata"])) if "metadata" in arrays else {}
    X = np.asarray(arrays["X"]).reshape(len(arrays["X"]), -1)
    Y = np.asarray(arrays["y"]).reshape(len(arrays["y"]), -1)
    classes = metadata.get("classes") or []
    layout = metadata.get("layout")
    if isinstance(layout, dict) and len(layout.get("feature_columns", ())) == X.shape[1]:
        frame = pd.DataFrame(X, columns=list(layout["feature_columns"]))
        if layout.get("label_kind") == "exact" and len(classes) == Y.shape[1]:
            # The NPZ holds one-hot rows: the class at each row's 1.
            frame[layout["label_column"]] = pd.Series(
                [classes[i] for i in Y.argmax(axis=1)], index=frame.index
            )
        else:
            for j, name in enumerate(layout["label_columns"]):
                frame[name] = Y[:, j]
        frame.attrs["dprelease"] = metadata
        return frame
    # A release made before layouts: x_<feature>, y_<class> as its tables had them.
    names = metadata.get("feature_names") or []
    x_cols = [f"x_{n}" for n in names] if len(names) == X.shape[1] else None
    y_cols = [f"y_{c}" for c in classes] if len(classes) == Y.shape[1] else None
    x_cols = x_cols or [f"x_{i}" for i in range(X.shape[1])]
    y_cols = y_cols or [f"y_{j}" for j in range(Y.shape[1])]
    frame = pd.DataFrame(np.hstack([X, Y]), columns=[*x_cols, *y_cols])
    frame.attrs["dprelease"] = metadata
    return frame
