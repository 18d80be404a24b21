"""Deduplication across the whole corpus, before the selection.

* **Exact**: rows whose normalised text (lower case, whitespace collapsed, trimmed) is equal.
* **Fuzzy** (text): MinHash-LSH over word 3-gram shingles (datasketch) finds candidate pairs;
  a pair is a duplicate when the smaller text's shingles are contained in the other's at
  ≥ ``containment`` (the same text with a footer, a header or a small edit).
* **Semantic near-duplicates** (SemDeDup's scheme): the unit embeddings of every shard are
  clustered together (faiss spherical k-means), and inside each cluster a row is a duplicate
  when a row ranked above it has cosine ≥ ``threshold``.

Rows are ranked by quality, then id (then shard and row), so the best-quality member of each
group is kept whatever file it came in. Every dropped row names the row it duplicates and why.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

__all__ = ["DedupResult", "deduplicate", "normalised_text_keys", "DEFAULT_THRESHOLD"]

DEFAULT_THRESHOLD = 0.98
DEFAULT_CONTAINMENT = 0.8
ROWS_PER_CLUSTER = 1000
SHINGLE_WORDS = 3
NUM_PERM = 128
# candidates from a low Jaccard, so that a short text with an added line (Jaccard ~0.5) is
# found; each candidate is then checked on its shingles (containment)
LSH_THRESHOLD = 0.3


@dataclass
class DedupResult:
    """``keep[i]``: bool mask of shard i's rows that stay. ``dropped``: one dict per dropped
    row: shard, row, dup_of_shard, dup_of_row, reason (``exact``, ``fuzzy`` or ``near``),
    cosine (near; 1 for exact; NaN for fuzzy) and containment (fuzzy)."""

    keep: list
    dropped: list = field(default_factory=list)
    stats: dict = field(default_factory=dict)


def normalised_text_keys(texts) -> np.ndarray:
    """The normalised text of each row (object array; None for a null text)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    arr = pa.array(texts, type=pa.large_string()) if not isinstance(texts, (pa.Array, pa.ChunkedArray)) else texts
    norm = pc.utf8_trim_whitespace(pc.replace_substring_regex(pc.utf8_lower(arr), r"\s+", " "))
    return np.asarray(norm.to_pylist(), dtype=object)


def _shingles(text: str) -> set:
    w = text.split(" ")
    if len(w) < SHINGLE_WORDS:
        return set()
    return {" ".join(w[i:i + SHINGLE_WORDS]) for i in range(len(w) - SHINGLE_WORDS + 1)}


def _fuzzy_pairs(keys: np.ndarray, rows: np.ndarray, containment: float, seed: int) -> list:
    """(a, b, containment) for rows whose shingle sets are near-contained: MinHash-LSH
    candidates (Jaccard >= LSH_THRESHOLD likely), verified on the shingles themselves."""
    from datasketch import MinHash, MinHashLSH

    sets = {int(r): _shingles(keys[r]) for r in rows if keys[r]}
    sets = {r: s for r, s in sets.items() if s}
    if len(sets) < 2:
        return []
    order = list(sets)
    hashes = MinHash.bulk([[s.encode() for s in sets[r]] for r in order], num_perm=NUM_PERM,
                          seed=seed + 1)
    lsh = MinHashLSH(threshold=LSH_THRESHOLD, num_perm=NUM_PERM)
    with lsh.insertion_session() as session:
        for r, h in zip(order, hashes):
            session.insert(r, h, check_duplication=False)
    out = []
    for r, h in zip(order, hashes):
        for o in lsh.query(h):
            if o <= r:
                continue
            a, b = sets[r], sets[o]
            c = len(a & b) / min(len(a), len(b))
            if c >= containment:
                out.append((r, int(o), c))
    return out


def _rank(q: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Global rank (0 = best): quality descending, then id, then position."""
    order = np.lexsort((np.arange(q.size), ids, -q)) if ids.dtype.kind in "iu" else \
        np.lexsort((np.arange(q.size), np.asarray(ids, dtype=str), -q))
    rank = np.empty(q.size, dtype=np.int64)
    rank[order] = np.arange(q.size)
    return rank


def _clusters(xn: np.ndarray, n_clusters: int, seed: int, probes: int) -> np.ndarray:
    """(N, probes): each row's nearest centroids (spherical k-means, faiss)."""
    if n_clusters <= 1:
        return np.zeros((xn.shape[0], 1), dtype=np.int64)
    import faiss

    km = faiss.Kmeans(xn.shape[1], n_clusters, niter=20, seed=seed, spherical=True,
                      verbose=False, min_points_per_centroid=1, max_points_per_centroid=256)
    km.train(xn)
    _, assign = km.index.search(xn, min(probes, n_clusters))
    return assign.astype(np.int64)


def deduplicate(x: np.ndarray, q: np.ndarray, ids: np.ndarray, shard_of: np.ndarray,
                row_of: np.ndarray, texts=None, *, exact: bool = True, fuzzy: bool = True,
                near: bool = True, threshold: float = DEFAULT_THRESHOLD,
                containment: float = DEFAULT_CONTAINMENT,
                rows_per_cluster: int = ROWS_PER_CLUSTER, probes: int = 2,
                seed: int = 0) -> DedupResult:
    """Deduplicate the corpus given as concatenated arrays: embeddings ``x`` (N, d), quality,
    ids, each row's shard index and row number, and optionally its text (for exact
    duplicates). Each row is compared inside its ``probes`` nearest clusters (2: a pair split
    by a cluster boundary is still found). Returns per-shard keep masks and the dropped rows
    with their lineage."""
    t0 = time.perf_counter()
    n = int(x.shape[0])
    rank = _rank(np.asarray(q, dtype=np.float64), np.asarray(ids))
    dup_of = np.full(n, -1, dtype=np.int64)
    reason = np.empty(n, dtype=object)
    cosine = np.full(n, np.nan)
    stats = {"rows": n, "threshold": threshold, "exact": exact, "fuzzy": fuzzy,
             "containment": containment, "near": near}
    keys = normalised_text_keys(texts) if texts is not None and (exact or fuzzy) else None

    if exact and keys is not None:
        valid = np.array([k is not None and k != "" for k in keys])
        idx = np.flatnonzero(valid)
        if idx.size:
            _, inv = np.unique(keys[idx].astype(str), return_inverse=True)
            # in each group of equal text, every row but the best ranked is a duplicate of it
            order = np.lexsort((rank[idx], inv))
            g, r = inv[order], idx[order]
            first = np.r_[True, g[1:] != g[:-1]]
            head = r[np.maximum.accumulate(np.where(first, np.arange(r.size), 0))]
            dups = ~first
            dup_of[r[dups]] = head[dups]
            reason[r[dups]] = "exact"
            cosine[r[dups]] = 1.0
        stats["exact_dropped"] = int((reason == "exact").sum())
    elif exact:
        stats["exact_skipped"] = "no text column"

    if fuzzy and keys is not None:
        alive = np.flatnonzero(dup_of < 0)
        pairs = _fuzzy_pairs(keys, alive, containment, seed)
        # every pair's worse-ranked row is a duplicate of its better-ranked one
        best_c = {}
        for a, b, c in pairs:
            lo, hi = (a, b) if rank[a] < rank[b] else (b, a)
            if c > best_c.get(hi, (None, -1.0))[1]:
                best_c[hi] = (lo, c)
        for r, (o, c) in best_c.items():
            dup_of[r], reason[r], cosine[r] = o, "fuzzy", np.nan
        stats["fuzzy_dropped"] = int(len(best_c))
        stats["fuzzy_pairs"] = int(len(pairs))
    elif fuzzy:
        stats["fuzzy_skipped"] = "no text column"

    if near and n > 1:
        alive = np.flatnonzero(dup_of < 0)
        xa = np.ascontiguousarray(x[alive], dtype=np.float32)
        xa /= np.maximum(np.linalg.norm(xa, axis=1, keepdims=True), 1e-30)
        k = max(1, int(round(alive.size / rows_per_cluster)))
        assign = _clusters(xa, k, seed, probes)
        stats["clusters"] = k
        for c in np.unique(assign):
            members = np.flatnonzero((assign == c).any(axis=1))
            if members.size < 2:
                continue
            members = members[np.argsort(rank[alive[members]], kind="stable")]
            xm = xa[members]
            # each member against the members ranked above it, in row blocks
            best = np.full(members.size, -np.inf, dtype=np.float32)
            arg = np.zeros(members.size, dtype=np.int64)
            for s in range(0, members.size, 2048):
                e = min(members.size, s + 2048)
                sim = xm[s:e] @ xm[:e].T  # (b, e)
                sim[np.arange(e - s)[:, None] <= (np.arange(e)[None, :] - s)] = -np.inf
                a = sim.argmax(axis=1)
                best[s:e] = sim[np.arange(e - s), a]
                arg[s:e] = a
            hit = np.flatnonzero(best >= threshold)
            rows = alive[members[hit]]
            better = np.isnan(cosine[rows]) | (best[hit] > cosine[rows])  # seen in 2 clusters
            rows, hit = rows[better], hit[better]
            dup_of[rows] = alive[members[arg[hit]]]
            reason[rows] = "near"
            cosine[rows] = best[hit]
        stats["near_dropped"] = int((reason == "near").sum())

    drop = np.flatnonzero(dup_of >= 0)
    keep = dup_of < 0
    fz = {r: c for r, (o, c) in (best_c.items() if fuzzy and keys is not None else [])}
    dropped = [{"shard": int(shard_of[i]), "row": int(row_of[i]),
                "dup_of_shard": int(shard_of[dup_of[i]]), "dup_of_row": int(row_of[dup_of[i]]),
                "reason": str(reason[i]), "cosine": float(cosine[i]),
                "containment": float(fz.get(int(i), np.nan))} for i in drop]
    n_shards = int(shard_of.max()) + 1 if n else 0
    masks = [keep[shard_of == s] for s in range(n_shards)]
    stats.update(dropped=int(drop.size), kept=int(keep.sum()),
                 dropped_fraction=float(drop.size / max(1, n)),
                 seconds=time.perf_counter() - t0)
    return DedupResult(keep=masks, dropped=dropped, stats=stats)
