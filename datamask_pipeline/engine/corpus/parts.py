"""One shard's rows in memory (:class:`Part`) and its own selection of k rows
(:func:`_select_part`, the shard solver with the exact k): what the corpus stage's per-shard
tasks and its in-memory modes share, and :func:`block_of`, a row's random block by a keyed hash
of its id."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from ..config import LearnerConfig

__all__ = ["Part", "block_of"]


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


def _splitmix64(v: np.ndarray) -> np.ndarray:
    z = v.astype(np.uint64)
    with np.errstate(over="ignore"):
        z = z + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z


def block_of(ids: np.ndarray, n_blocks: int, seed: int = 0) -> np.ndarray:
    """Each id's random block (0..n_blocks-1) by a keyed hash of the id: the same id lands in
    the same block whatever file it came in."""
    ids = np.asarray(ids)
    if ids.dtype.kind in "iu":
        key = _splitmix64(np.asarray([seed], dtype=np.uint64))[0]
        h = _splitmix64(ids.astype(np.int64).view(np.uint64) ^ key)
    else:
        k = seed.to_bytes(8, "little", signed=True)
        h = np.fromiter((int.from_bytes(hashlib.blake2b(str(i).encode(), digest_size=8,
                                                         key=k).digest(), "little")
                         for i in ids), dtype=np.uint64, count=len(ids))
    return (h % np.uint64(n_blocks)).astype(np.int64)


def load_checked(shard):
    """The shard's kept rows (a ``Part``), checked against the size the coordinator planned."""
    from ..config import ConfigError

    part = shard.load()
    if part.n != shard.n:
        raise ConfigError(f"shard {shard.key}: {part.n} rows read, {shard.n} expected")
    return part


def stats_numpy(parts: dict) -> dict:
    """Sufficient statistics as float64 numpy arrays (what a task returns to the coordinator)."""
    return {n: np.asarray(v.detach().cpu().numpy() if hasattr(v, "detach") else v,
                          dtype=np.float64) for n, v in parts.items()}
