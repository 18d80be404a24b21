"""One shard's rows in memory (:class:`Part`) and its own selection of k rows
(:func:`_select_part`, the shard solver with the exact k): what the corpus stage's per-shard
tasks and its in-memory modes share."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import LearnerConfig

__all__ = ["Part"]


@dataclass
class Part:
    """A shard's arrays in memory (what a ``CorpusShard.load`` may return)."""

    embeddings: np.ndarray
    quality: np.ndarray
    ids: np.ndarray

    @property
    def n(self):
        return int(self.embeddings.shape[0])

    @property
    def d(self):
        return int(self.embeddings.shape[1])


def _arrays(sh):
    return sh.embeddings, sh.quality, sh.ids


def _ratio_for(k: int, n: int) -> float:
    """A select_ratio r with round(r · n) == k exactly."""
    from ..config import n_select

    r = k / n
    for nudge in (0.0, 1e-12, -1e-12, 1e-9, -1e-9):
        if n_select(r + nudge, n) == k:
            return r + nudge
    raise AssertionError(f"no ratio gives k={k} of n={n}")  # pragma: no cover


def _select_part(shard, k: int, cfg: LearnerConfig, device, mem_budget):
    """k rows of one part (shard or block): (row numbers, route)."""
    from ..baselines import quality_topk
    from ..select import select_shard

    n = int(shard.embeddings.shape[0])
    if k <= 0:
        return np.zeros(0, dtype=np.int64), "empty"
    if k >= n:
        return np.arange(n, dtype=np.int64), "all"
    min_k = max(cfg.diversity_term().min_k, 1)
    if k < min_k or n - k < 1:
        return (np.sort(quality_topk(shard.quality, k, shard.ids)),
                "topk (k below the term's minimum)")
    sel = select_shard(shard, cfg.replace(select_ratio=_ratio_for(k, n)), device=device,
                       mem_budget=mem_budget, references=False)
    return sel.indices, sel.route
