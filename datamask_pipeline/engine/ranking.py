"""Deterministic orderings of a shard: by logit or quality, ties broken by id."""

from __future__ import annotations

import numpy as np


def id_rank(ids, n: int) -> np.ndarray:
    if ids is None:
        return np.arange(n)
    ids = np.asarray(ids)
    order = np.argsort(ids, kind="stable")
    r = np.empty(n, dtype=np.int64)
    r[order] = np.arange(n)
    return r


def readout(logits: np.ndarray, k: int, ids=None) -> tuple[np.ndarray, np.ndarray]:
    """Top-k by logit, ties by id ascending. Returns (selected bool, rank)."""
    n = logits.shape[0]
    order = np.lexsort((id_rank(ids, n), -logits.astype(np.float64)))
    rank = np.empty(n, dtype=np.int64)
    rank[order] = np.arange(n)
    return rank < k, rank


def quality_pool(q: np.ndarray, prune_ratio: float, ids=None) -> np.ndarray:
    """Indices kept after dropping the bottom prune_ratio by quality (sorted)."""
    n = q.shape[0]
    drop = int(prune_ratio * n)
    if drop == 0:
        return np.arange(n)
    order = np.lexsort((id_rank(ids, n), -q.astype(np.float64)))
    return np.sort(order[: n - drop])
