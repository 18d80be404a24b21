"""Facility location past one process: blocks cut by a corpus-wide k-means, one shared gain
threshold (the corpus stage's ``exchange`` route for facility location).

Facility location has no sufficient statistics: a row's coverage is its best similarity to
any selected row, wherever that row lives. Its nearest neighbours, though, are mostly in
its own cluster. So the route is:

1. **Clusters.** A seeded sample of every shard's rows (one task per shard) fits a spherical
   k-means (faiss) here; the centroids are the only corpus-wide state besides the budget.
2. **Shuffle.** Each shard's task assigns its rows to the nearest centroid and writes them,
   grouped by cluster, through the run's state on the data root (:class:`checkpoint.RunState`):
   one file per (shard, group of clusters) it has rows in. A cluster of more than
   ``block_rows`` rows is split into blocks by a keyed hash of the id, so a block does not
   depend on how the corpus was cut into files.
3. **Greedy per block, one threshold.** With coverage counted inside its block, the corpus
   objective at the final size k is a sum over blocks,
   f(U) = Σ_b [λ/k · Σ_{j∈U_b} q_j + (1−λ)/N · Σ_{i∈b} max_{j∈U_b} s_ij],
   and a row's gain depends only on its own block's picks. Each group's task runs lazy greedy
   in each of its blocks on these gains and saves the gain sequences (non-increasing, a
   monotone submodular objective) with their picks in the run's state. Greedy over the whole
   corpus on this objective picks the largest head among the blocks each time, which is the
   k largest gains of the merged sequences: one shared threshold (Badanidiyuru & Vondrák's
   threshold greedy with the threshold found exactly), found from a histogram of the groups'
   gains (``sharded.kth_largest``). Each group takes its gains above it and writes each
   shard's taken rows; a block whose sequence ran out above the threshold runs again with
   twice the length. Each shard's task then gathers its rows into the run's state.

Memory: the coordinator holds the sample, the centroids, each group's gain count and range,
and the (shards × groups) row counts: no gain and no pick; a group's task holds its rows and
one block's dense similarity (``block_rows``²).
Scoring: when the corpus fits one selection, on the whole corpus; else the block-local f,
a lower bound of f (a row covered better from another block counts its block's coverage).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .. import storage
from .checkpoint import _npz_bytes, _npz_read
from .sharded import kth_largest

__all__ = ["BlockContext", "BLOCK_ROWS", "GROUP_ROWS", "SAMPLE_ROWS", "MAX_CLUSTERS",
           "SCORE_CLIENTS", "select_blocks", "estimate_scores"]

BLOCK_ROWS = 8192  # one block's dense similarity: BLOCK_ROWS² floats (256 MiB)
GROUP_ROWS = 1 << 18  # rows one group task reads (its blocks, one at a time)
SAMPLE_ROWS = 1 << 16  # rows the k-means is fitted on (all shards together)
MAX_CLUSTERS = 4096  # k-means centroids; larger clusters are split into blocks by id hash
HEAD_FACTOR = 2  # a block's first gain sequence: this many times its proportional share
SCORE_CLIENTS = 8192  # rows of the sample the whole-corpus coverage is estimated on


@dataclass
class BlockContext:
    """What every task of one facility-blocks run shares (one object in Ray's store)."""

    lamb: float
    k: int
    n: int
    state: object  # RunState
    centroids: np.ndarray | None = None
    groups: int = 1
    block_rows: int = BLOCK_ROWS
    seed: int = 0
    device: str = "cpu"
    neighbors: int | None = None  # the corpus term's K-neighbour similarity; None = dense

    def stats(self):
        """Facility location has no sufficient statistics (``token_fit``'s run context)."""
        return None


def _unit(x) -> np.ndarray:
    x = np.asarray(x, dtype=np.float32)
    norm = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.maximum(norm, 1e-12)


def _id_hash(ids, seed: int) -> np.ndarray:
    from .parts import block_of

    return block_of(np.asarray(ids), 1 << 30, seed)


def _load(shard):
    from .parts import load_checked as load

    return load(shard)


def _group_uri(ctx: BlockContext, g: int, i: int) -> str:
    return storage.join(ctx.state.dir, f"blk-g{g:05d}-s{i:06d}.npz")


def _seq_uri(ctx: BlockContext, g: int) -> str:
    """A group's gain sequences: every block's picks (shard, row) and gains, in block order."""
    return storage.join(ctx.state.dir, f"seq-g{g:05d}.npz")


def _pick_uri(ctx: BlockContext, g: int, i: int) -> str:
    """The rows of shard ``i`` that group ``g``'s blocks take at the threshold."""
    return storage.join(ctx.state.dir, f"pick-g{g:05d}-s{i:06d}.npz")


# ------------------------------------------------------------------ tasks
def task_sample(seed: int, i: int, shard, below: int):
    """The shard's rows whose keyed id hash is below ``below`` (of 2³⁰): (hashes, unit rows).
    A row is in the sample by its id, whatever file it came in."""
    part = _load(shard)
    h = _id_hash(part.ids, seed + 1)
    rows = np.flatnonzero(h < below)
    return h[rows], _unit(part.embeddings[rows])


def task_shuffle(ctx: BlockContext, i: int, shard):
    """The shard's rows assigned to their nearest centroid and written by group of clusters
    (unit rows float32, quality, row number, cluster, id hash); the rows per group."""
    part = _load(shard)
    cen = torch.as_tensor(ctx.centroids)
    x = part.embeddings
    cluster = np.empty(part.n, dtype=np.int64)
    for s in range(0, part.n, 65536):
        xs = torch.as_tensor(_unit(x[s:s + 65536]))
        cluster[s:s + 65536] = torch.argmax(xs @ cen.T, dim=1).numpy()
    group = cluster % ctx.groups
    h = _id_hash(part.ids, ctx.seed)
    q = np.asarray(part.quality, dtype=np.float64)
    counts = np.bincount(group, minlength=ctx.groups)
    for g in np.flatnonzero(counts):
        r = np.flatnonzero(group == g)
        storage.atomic_write_bytes(_group_uri(ctx, int(g), i), _npz_bytes(
            x=_unit(x[r]), q=q[r], row=r.astype(np.int64), cluster=cluster[r], hash=h[r]))
    return counts, (float(q.min()), float(q.max())) if q.size else (np.inf, -np.inf)


def _blocks_of(cluster: np.ndarray, h: np.ndarray, block_rows: int) -> list:
    """A group's blocks: (cluster, part, member positions), a cluster of more rows than
    ``block_rows`` split into equal parts by the id hash."""
    out = []
    for c in np.unique(cluster):
        mem = np.flatnonzero(cluster == c)
        mem = mem[np.argsort(h[mem], kind="stable")]  # the same order whatever the files
        parts = max(1, math.ceil(mem.size / block_rows))
        sub = h[mem] % parts
        for p in range(parts):
            out.append((int(c), p, mem[sub == p]))
    return out


def block_greedy(x: torch.Tensor, q: np.ndarray, length: int, lamb: float, wq: float,
                 wd: float, neighbors: int | None = None, refresh: int = 64):
    """Lazy greedy on one block of m rows: (picks, gains), ``length`` picks. The t-th pick
    maximises the block's own objective at size t+1, λ·q_j + (1−λ)·(t+1)/m·c_j with
    c_j = Σ_i (s_ij − b_i)⁺ (b: the rows' best coverage by the picks so far, s the clipped
    cosine of the unit rows ``x``): the whole-corpus greedy's key (:meth:`terms.facility.
    FacilityLocation.greedy`) on the block, so one block is exactly that greedy. Each pick's
    gain is its increment of the corpus objective, wq·q_j + wd·c_j. Coverage gains only fall
    as picks are added (submodular), so stale ones are upper bounds: the best keys are
    refreshed in blocks until the best fresh key beats every stale one. ``neighbors`` = K:
    the sparse similarity of facility location (:mod:`engine.terms.neighbors`): a row is
    covered only by its K nearest rows (here: of the block)."""
    m = x.shape[0]
    length = min(int(length), m)
    # C[j, i]: how well candidate j covers row i, one contiguous row per candidate
    C = (x @ x.T).clamp_(min=0)
    if neighbors is not None and int(neighbors) < m:
        v, nb = C.topk(int(neighbors), dim=1)  # row i's K nearest cover it
        C = torch.zeros_like(C).scatter_(1, nb, v).T.contiguous()
    qt = torch.as_tensor(np.asarray(q, dtype=np.float64)).to(C.dtype)
    best = torch.zeros(m, dtype=C.dtype)
    cover = C.sum(1)  # coverage gains: exact for the first pick, upper bounds later
    fresh = torch.ones(m, dtype=torch.bool)
    chosen = torch.zeros(m, dtype=torch.bool)
    neg = torch.tensor(-torch.inf, dtype=C.dtype)
    picks = np.empty(length, dtype=np.int64)
    gains = np.empty(length, dtype=np.float64)
    for t in range(length):
        scale = (1.0 - lamb) * (t + 1) / m
        while True:
            key = torch.where(chosen, neg, lamb * qt + scale * cover)
            j = int(torch.argmax(torch.where(fresh, key, neg)))
            if bool(fresh[j]) and key[j] >= torch.where(fresh, neg, key).max():
                break
            stale = torch.where(fresh | chosen, neg, key)
            cand = torch.topk(stale, min(refresh, int((~fresh & ~chosen).sum()))).indices
            cover[cand] = (C[cand] - best).clamp_(min=0).sum(1)
            fresh[cand] = True
        picks[t], gains[t] = j, wq * float(qt[j]) + wd * float(cover[j])
        chosen[j] = True
        best = torch.maximum(best, C[j])
        fresh[:] = False
    return picks, gains


def task_group(ctx: BlockContext, g: int, shards_in: list, lengths: dict):
    """Greedy in each block of group ``g`` (read from the shards' files ``shards_in``), its
    gain sequences (made non-increasing) saved with their picks as (shard, row) in the run's
    state, in block order. ``lengths``: a block's sequence length, by key (default:
    ``HEAD_FACTOR`` × its share). Returns (blocks, gains, the gains' min and max)."""
    parts = [(i, _npz_read(storage.read_bytes(_group_uri(ctx, g, i)))) for i in shards_in]
    shard = np.concatenate([np.full(p["row"].size, i, dtype=np.int64) for i, p in parts])
    arrays = {n: np.concatenate([p[n] for _, p in parts]) for n in ("x", "q", "row", "cluster",
                                                                  "hash")}
    wq, wd = ctx.lamb / ctx.k, (1.0 - ctx.lamb) / ctx.n
    keys, sizes, seqs = [], [], []
    for c, p, mem in _blocks_of(arrays["cluster"], arrays["hash"], ctx.block_rows):
        length = lengths.get((c, p)) or max(1, math.ceil(HEAD_FACTOR * ctx.k * mem.size / ctx.n))
        picks, gains = block_greedy(torch.as_tensor(arrays["x"][mem]), arrays["q"][mem],
                                    length, ctx.lamb, wq, wd, ctx.neighbors)
        keys.append((c, p))
        sizes.append(mem.size)
        seqs.append((shard[mem][picks], arrays["row"][mem][picks],
                     np.minimum.accumulate(gains)))
    gains = np.concatenate([sq[2] for sq in seqs])
    storage.atomic_write_bytes(_seq_uri(ctx, g), _npz_bytes(
        key=np.asarray(keys, dtype=np.int64).reshape(-1, 2), n=np.asarray(sizes, np.int64),
        length=np.asarray([sq[2].size for sq in seqs], np.int64),
        shard=np.concatenate([sq[0] for sq in seqs]), row=np.concatenate([sq[1] for sq in seqs]),
        gain=gains))
    return len(keys), int(gains.size), float(gains.min()), float(gains.max())


def group_gains(ctx: BlockContext, g: int) -> np.ndarray:
    """Group ``g``'s gains, every block's sequence (what the shared threshold ranks)."""
    return _npz_read(storage.read_bytes(_seq_uri(ctx, g)))["gain"]


def task_take(shared, g: int, take_eq: int, shards_in: list):
    """Group ``g``'s blocks at the threshold ``t``: each takes its gains above ``t`` and, in
    block order, the group's first ``take_eq`` gains at ``t``. Writes each shard's taken rows
    (``shards_in``: every shard with rows in the group, so an empty take overwrites an
    earlier pass's) and returns (the taken gains' sum, the blocks whose whole sequence was
    taken and that have rows left: key, rows, length)."""
    ctx, t = shared
    z = _npz_read(storage.read_bytes(_seq_uri(ctx, g)))
    gain = z["gain"]
    taken = gain > t
    at = np.flatnonzero(gain == t)[:int(take_eq)]  # sequences are in block order
    taken[at] = True
    ends = np.cumsum(z["length"])
    took = np.add.reduceat(taken, ends - z["length"]) if ends.size else np.zeros(0, np.int64)
    short = [((int(kk[0]), int(kk[1])), int(n), int(ln))
             for kk, n, ln, tk in zip(z["key"], z["n"], z["length"], took) if tk == ln < n]
    for i in shards_in:
        rows = z["row"][taken & (z["shard"] == i)]
        storage.atomic_write_bytes(_pick_uri(ctx, g, int(i)), _npz_bytes(rows=rows))
    return float(gain[taken].sum()), short


def task_collect(ctx: BlockContext, i: int, groups: np.ndarray):
    """Shard ``i``'s selected rows from its groups' takes, saved as version 0 of the run's
    state (never sent to the coordinator; the takes are removed with the groups' files by
    :func:`task_clear_groups`); returns their count."""
    rows = [_npz_read(storage.read_bytes(_pick_uri(ctx, int(g), i)))["rows"] for g in groups]
    rows = np.sort(np.concatenate([np.zeros(0, dtype=np.int64)] + rows))
    ctx.state.save_rows(i, 0, rows)
    return int(rows.size)


def task_cover(shared, i: int, shard, version: int, take_eq: int, n_random: int):
    """The shard's part of three selections (the run's rows, ``version`` of the run's state;
    the corpus's quality top-k: rows above ``t`` and the first ``take_eq`` at ``t``;
    ``n_random`` random rows): per selection its quality sum, its size and each client's best
    clipped cosine to its rows in this shard (``clients``: unit rows, the sample the coverage
    is estimated on)."""
    clients, t, seed, state = shared
    rows = state.load_rows(i, version)[0]
    part = _load(shard)
    q = np.asarray(part.quality, dtype=np.float64)
    top = np.union1d(np.flatnonzero(q > t), np.flatnonzero(q == t)[:take_eq])
    rnd = (np.sort(np.random.default_rng([seed, i]).choice(part.n, size=n_random,
                                                           replace=False))
           if n_random else np.zeros(0, dtype=np.int64))
    c = torch.as_tensor(clients)
    out = {}
    for name, r in (("selection", np.asarray(rows, dtype=np.int64)), ("quality_topk", top),
                    ("random", rnd)):
        best = torch.zeros(c.shape[0], dtype=c.dtype)
        for s in range(0, r.size, 8192):
            xs = torch.as_tensor(_unit(part.embeddings[r[s:s + 8192]]))
            best = torch.maximum(best, (c @ xs.T).amax(dim=1).clamp_(min=0))
        out[name] = (float(q[r].sum()), int(r.size), best.numpy())
    return out


def estimate_scores(shards: list, ex, lamb: float, k: int, clients: np.ndarray,
                    state, version: int, q_range: tuple, seed: int) -> tuple:
    """Whole-corpus f of the run's selection (``version`` of each shard's rows in ``state``),
    quality top-k and random, with the quality term exact and the coverage term the mean
    over ``clients`` (a uniform sample of the corpus's rows, chosen by id hash) of each one's
    best coverage: an unbiased estimate, with its standard error ``f_div_se`` (the three
    share their clients, so their differences are far tighter). Returns (scores, the quality
    top-k's threshold and each shard's rows at it: ``sharded.topk_threshold``)."""
    from .sharded import topk_threshold

    t, takes = topk_threshold(ex, shards, k, q_range)
    sizes = np.array([s.n for s in shards], dtype=np.int64)
    n_random = np.random.default_rng(seed).multivariate_hypergeometric(sizes, k)
    res = ex.map(task_cover, [(i, s, version, takes[i], int(n_random[i]))
                              for i, s in enumerate(shards)], shared=(clients, t, seed, state))
    scores, best = {}, {}
    for name in ("selection", "quality_topk", "random"):
        q_sum = sum(r[name][0] for r in res)
        size = sum(r[name][1] for r in res)
        best[name] = np.max(np.stack([r[name][2] for r in res]), axis=0).astype(np.float64)
        f_qua = q_sum / max(size, 1)
        f_div = float(best[name].mean())
        scores[name] = {"f": lamb * f_qua + (1 - lamb) * f_div, "f_qua": f_qua,
                        "f_div": f_div, "f_div_se": float(best[name].std() /
                                                          np.sqrt(best[name].size)),
                        "clients": int(best[name].size)}
    diff = best["selection"] - best["quality_topk"]
    scores["selection"]["f_minus_quality_topk_se"] = float(
        (1 - lamb) * diff.std() / np.sqrt(diff.size))
    return scores, (t, takes)


def task_clear_groups(ctx: BlockContext, i: int, groups: np.ndarray):
    for g in groups:
        storage.remove(_group_uri(ctx, int(g), i))
        storage.remove(_pick_uri(ctx, int(g), i))
    return 0


def task_clear_seq(ctx: BlockContext, g: int):
    storage.remove(_seq_uri(ctx, g))
    return 0


# ------------------------------------------------------------------ the coordinator
def _fit_centroids(sample: np.ndarray, n_clusters: int, seed: int) -> np.ndarray:
    from .dedup import _train_kmeans

    if n_clusters <= 1:
        c = sample.mean(0, keepdims=True)
        return _unit(c if np.linalg.norm(c) > 0 else sample[:1])
    km = _train_kmeans(np.ascontiguousarray(sample, dtype=np.float32), n_clusters, seed)
    return _unit(km.centroids)


def select_blocks(shards: list, ctx: BlockContext, ex, log=lambda m: None,
                  sample_rows: int = SAMPLE_ROWS, max_clusters: int = MAX_CLUSTERS,
                  group_rows: int = GROUP_ROWS) -> dict:
    """The facility-blocks selection of ``ctx.k`` rows of ``shards`` (kept views) on executor
    ``ex``, each shard's rows saved as version 0 of ``ctx.state`` by its own task (the
    coordinator holds the centroids, the groups' sizes and the threshold, never a pick):
    {"counts": each shard's rows, "f_blocks": block-local f, "blocks": count, "clusters":
    count, "passes": greedy passes, "threshold": the shared gain threshold}."""
    n, k = ctx.n, ctx.k
    # the sample: the rows of the smallest id hashes (about sample_rows of them), in hash
    # order, so the clusters do not depend on how the corpus was cut into files
    below = int(min(1.0, 1.25 * sample_rows / max(n, 1)) * (1 << 30))
    got = ex.map(task_sample, [(i, s, below) for i, s in enumerate(shards)], shared=ctx.seed)
    hs = np.concatenate([np.zeros(0, dtype=np.int64)] + [g[0] for g in got])
    order = np.argsort(hs, kind="stable")[:int(sample_rows)]
    sample = np.concatenate([g[1] for g in got])[order]
    del got, hs
    n_clusters = int(min(max_clusters, max(1, math.ceil(2 * n / ctx.block_rows)),
                         max(1, sample.shape[0] // 39)))
    ctx.centroids = _fit_centroids(sample, n_clusters, ctx.seed)
    ctx.groups = max(1, min(n_clusters, math.ceil(n / group_rows)))
    log(f"corpus: facility blocks: {n_clusters:,} clusters in {ctx.groups:,} group(s), "
        f"blocks of at most {ctx.block_rows:,} rows")
    shuffled = ex.map(task_shuffle, [(i, s) for i, s in enumerate(shards)], shared=ctx)
    counts = np.stack([c for c, _ in shuffled])  # (shards, groups)
    q_range = (min(r[0] for _, r in shuffled), max(r[1] for _, r in shuffled))
    members = [np.flatnonzero(counts[:, g]).tolist() for g in range(ctx.groups)]
    seqs: dict = {}  # group -> (blocks, gains, min, max)
    try:
        lengths: dict = {}
        todo = list(range(ctx.groups))
        passes = 0
        while todo:
            passes += 1
            res = ex.map(task_group, [(g, members[g],
                                       {kk: v for kk, v in lengths.items() if kk[0] % ctx.groups == g})
                                      for g in todo], shared=ctx)
            seqs.update(zip(todo, res))
            groups = sorted(seqs)
            total = sum(seqs[g][1] for g in groups)
            if total >= k:  # the k-th largest gain of the merged sequences, ties in block order
                t, takes = kth_largest(ex, group_gains, ctx, [(g,) for g in groups], k,
                                       (min(seqs[g][2] for g in groups),
                                        max(seqs[g][3] for g in groups)))
            else:  # every gain (short blocks run again below)
                t, takes = -np.inf, [0] * len(groups)
            took = ex.map(task_take, [(g, takes[j], members[g]) for j, g in enumerate(groups)],
                          shared=(ctx, t))
            short = [s_ for _, sh in took for s_ in sh]
            if total < k and not short:
                raise AssertionError("facility blocks: fewer rows than k")  # pragma: no cover
            for kk, n_rows, length in short:
                lengths[kk] = min(n_rows, 2 * length)
            todo = sorted({kk[0] % ctx.groups for kk, _, _ in short})
            if todo:
                log(f"corpus: facility blocks: {len(short):,} block(s) ran out above the "
                    "threshold: their greedy runs again, twice as long")
        f_blocks = float(sum(f for f, _ in took))
        picked = ex.map(task_collect, [(i, np.flatnonzero(counts[i]))
                                       for i in range(len(shards))], shared=ctx)
    finally:
        ex.map(task_clear_groups, [(i, np.flatnonzero(counts[i])) for i in range(len(shards))],
               shared=ctx)
        ex.map(task_clear_seq, [(g,) for g in sorted(seqs)], shared=ctx)
    return {"counts": picked, "f_blocks": f_blocks,
            "blocks": int(sum(seqs[g][0] for g in seqs)), "clusters": n_clusters,
            "passes": passes, "threshold": float(t),
            "clients": sample[:SCORE_CLIENTS], "q_range": q_range}
