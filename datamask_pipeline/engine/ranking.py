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


def order_by(values, ids=None, first=None) -> np.ndarray:
    """Row indices by ``values`` descending, ties by id ascending (by index without ids); with
    ``first`` (bool per row), those rows come before all others, each part ordered alike."""
    values = np.asarray(values)
    n = values.shape[0]
    keys = [id_rank(ids, n), -values.astype(np.float64)]
    if first is not None:
        keys.append(~np.asarray(first, dtype=bool))
    return np.lexsort(tuple(keys))


def ranks(order: np.ndarray) -> np.ndarray:
    """The rank of every row (0 = first) from an ordering of the rows."""
    rank = np.empty(order.shape[0], dtype=np.int64)
    rank[order] = np.arange(order.shape[0])
    return rank


def readout(logits: np.ndarray, k: int, ids=None) -> tuple[np.ndarray, np.ndarray]:
    """Top-k by logit, ties by id ascending. Returns (selected bool, rank)."""
    rank = ranks(order_by(logits, ids))
    return rank < k, rank


def rank_selection_first(selected: np.ndarray, logits: np.ndarray, ids=None) -> np.ndarray:
    """Ranks with the ``selected`` rows first, each part by logit (descending), ties by id, so
    that ``rank < k`` is the selection."""
    return ranks(order_by(logits, ids, first=selected))


def quality_pool(q: np.ndarray, prune_ratio: float, ids=None) -> np.ndarray:
    """Indices kept after dropping the bottom prune_ratio by quality (sorted)."""
    n = q.shape[0]
    drop = int(prune_ratio * n)
    if drop == 0:
        return np.arange(n)
    return np.sort(order_by(q, ids)[: n - drop])
