"""One engine step's forward pass, with a failure kept to the rows that cause it.

A batch that raises (a key beyond `kv=float16`'s range, logits that are not finite) runs again row by row,
and only the rows that fail alone get the error: one request that breaks the model's numbers does not end
the others that shared its step. A row run again rewrites the same positions of its own slot, so the
retry leaves every cache as one clean pass would.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def forward_rows(model: Any, slots: Any, rows: list, wanted: list[int]) -> list[np.ndarray | Exception]:
    """Each row's logits (host arrays of its `wanted` last positions, checked finite) from one ragged
    pass of `model.forward_ragged`, or, where that pass failed, from each row alone: its logits or its
    error. A single row's failure is raised."""
    try:
        return _forward(model, slots, rows, wanted)
    except Exception:
        if len(rows) == 1:
            raise
    parts: list[np.ndarray | Exception] = []
    for row, n in zip(rows, wanted, strict=True):
        try:
            parts += _forward(model, slots, [row], [n])
        except Exception as exc:
            parts.append(exc)
    return parts


def _forward(model: Any, slots: Any, rows: list, wanted: list[int]) -> list[np.ndarray]:
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # checked right below
        logits = model.backend.to_numpy(model.forward_ragged(rows, slots, wanted))
    model.check_logits(logits, sum(wanted))
    ends = np.cumsum(wanted)
    return [logits[end - n : end] for end, n in zip(ends, wanted, strict=True)]
