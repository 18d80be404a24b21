"""Deduplication across the whole corpus, before the selection.

* **Exact**: rows whose normalised text (lower case, whitespace collapsed, trimmed, lines that
  occur in ``boilerplate_min_docs`` or more texts left out) is equal.
* **Fuzzy** (text): MinHash signatures (datasketch) of word 3-gram shingles, banded (LSH) into
  candidate pairs;
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
BOILERPLATE_MIN_DOCS = 5  # a line in this many texts is boilerplate, left out of text keys
SHINGLE_WORDS = 3
NUM_PERM = 126
# 42 bands of 3 values: a pair at Jaccard 0.3 shares a band with probability 0.68, at 0.5 with
# 0.996, so a short text with an added line (Jaccard ~0.5) is found; every candidate is then
# checked on its shingles (containment)
BANDS, BAND_ROWS = 42, 3


@dataclass
class DedupResult:
    """``keep[i]``: bool mask of shard i's rows that stay. ``dropped``: one dict per dropped
    row: shard, row, dup_of_shard, dup_of_row, reason (``exact``, ``fuzzy`` or ``near``),
    cosine (near; 1 for exact; NaN for fuzzy) and containment (fuzzy)."""

    keep: list
    dropped: list = field(default_factory=list)
    stats: dict = field(default_factory=dict)


def normalised_text_keys(texts, boilerplate_min_docs: int | None = None) -> np.ndarray:
    """The normalised text of each row (lower case, whitespace collapsed; object array, None
    for a null text). With ``boilerplate_min_docs``, lines that occur in at least that many
    texts of the corpus (footers, headers, navigation: CCNet-style line deduplication) are
    removed first, so a text with such a line added has the key of the text without it."""
    import pyarrow as pa

    arr = pa.array(texts, type=pa.large_string()) if not isinstance(texts, (pa.Array, pa.ChunkedArray)) else texts
    if boilerplate_min_docs:
        from collections import Counter

        lines = [_doc_lines(t) for t in arr.to_pylist()]
        counts = Counter(ln for doc in lines for ln in _distinct_lines(doc))
        common = {ln for ln, c in counts.items() if c >= boilerplate_min_docs}
        arr = _strip_lines(arr, common, lines)
    return _normalise(arr)


def _doc_lines(text):
    """A text's lines, each lower-cased with its whitespace collapsed (None for a null text)."""
    return None if text is None else [" ".join(ln.lower().split()) for ln in text.splitlines()]


def _distinct_lines(doc) -> set:
    """The distinct non-empty lines of one text (what the boilerplate count counts once)."""
    return {ln for ln in set(doc) if ln} if doc else set()


def _strip_lines(arr, common: set, lines=None):
    """``arr`` (texts) with the ``common`` (boilerplate) lines left out; ``arr`` itself when
    there are none. Row-wise: any slice of the corpus gives the same rows."""
    import pyarrow as pa

    if not common:
        return arr
    if lines is None:
        lines = [_doc_lines(t) for t in arr.to_pylist()]
    return pa.array([None if doc is None else "\n".join(ln for ln in doc if ln not in common)
                     for doc in lines], type=pa.large_string())


def _normalise(arr) -> np.ndarray:
    """Lower case, whitespace runs to one space, trimmed (object array; None stays None)."""
    import pyarrow.compute as pc

    norm = pc.utf8_trim_whitespace(pc.replace_substring_regex(pc.utf8_lower(arr), r"\s+", " "))
    return np.asarray(norm.to_pylist(), dtype=object)


def _shingles(text: str) -> set:
    w = text.split(" ")
    if len(w) < SHINGLE_WORDS:
        return set()
    return {" ".join(w[i:i + SHINGLE_WORDS]) for i in range(len(w) - SHINGLE_WORDS + 1)}


def _signatures(keys: np.ndarray, rows: np.ndarray, seed: int, chunk: int = 20_000):
    """(rows with shingles, (m, NUM_PERM) uint32 MinHash signatures), computed by datasketch
    a chunk of texts at a time and kept as one array (no per-text objects held)."""
    from datasketch import MinHash

    have, sigs = [], []
    for s in range(0, rows.size, chunk):
        part = [(int(r), _shingles(keys[r])) for r in rows[s:s + chunk] if keys[r]]
        part = [(r, sh) for r, sh in part if sh]
        if not part:
            continue
        hs = MinHash.bulk([[x.encode() for x in sh] for _, sh in part], num_perm=NUM_PERM,
                          seed=seed + 1)
        sigs.append(np.stack([h.hashvalues for h in hs]).astype(np.uint32))
        have += [r for r, _ in part]
    if not have:
        return np.zeros(0, dtype=np.int64), np.zeros((0, NUM_PERM), dtype=np.uint32)
    return np.asarray(have, dtype=np.int64), np.concatenate(sigs)


def _fuzzy_pairs(keys: np.ndarray, rows: np.ndarray, rank: np.ndarray, containment: float,
                 seed: int) -> list:
    """(worse, better, containment): LSH bands of the MinHash signatures (BANDS bands of
    BAND_ROWS values: pairs at Jaccard ~0.3 and up are likely to share a band) propose each
    row's best-ranked band mate and the next better-ranked one; the pair is kept when the smaller text's shingles are
    contained in the other's at >= ``containment``. Memory: the signatures, 4 bytes x
    NUM_PERM per text."""
    have, sig = _signatures(keys, rows, seed)
    if have.size < 2:
        return []
    cand = set()
    order = np.argsort(rank[have], kind="stable")  # best ranked first in every bucket
    have, sig = have[order], sig[order]
    for b in range(BANDS):
        band = np.ascontiguousarray(sig[:, b * BAND_ROWS:(b + 1) * BAND_ROWS]).view(
            np.dtype((np.void, 4 * BAND_ROWS))).ravel()
        _, first, inv = np.unique(band, return_index=True, return_inverse=True)
        head = first[inv]  # the best-ranked row with the same band (rows are in rank order)
        m = head != np.arange(have.size)
        cand.update(zip(have[m].tolist(), have[head[m]].tolist()))
        # and the next better-ranked row of the same band (a chain through a large bucket)
        o = np.argsort(inv, kind="stable")
        same = inv[o[1:]] == inv[o[:-1]]
        cand.update(zip(have[o[1:][same]].tolist(), have[o[:-1][same]].tolist()))
    out = []
    # in (worse, better) order: of two partners at the same containment the first in the
    # corpus's (shard, row) order is named, whatever the set's order (dedup_ray does the same)
    for worse, better in sorted(cand):
        a, b = _shingles(keys[worse]), _shingles(keys[better])
        c = len(a & b) / min(len(a), len(b))
        if c >= containment:
            out.append((worse, better, c))
    return out


def _rank(q: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Global rank (0 = best): quality descending, then id, then position."""
    order = _rank_order(q, ids, np.arange(q.size))
    rank = np.empty(q.size, dtype=np.int64)
    rank[order] = np.arange(q.size)
    return rank


def _rank_order(q: np.ndarray, ids: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The order (best first) of rows given their quality, id and global position: quality
    descending, then id (integers as numbers, anything else as text), then position. Any
    subset of the corpus sorts in the order of its rows' global ranks."""
    ids = np.asarray(ids)
    return np.lexsort((pos, ids, -q)) if ids.dtype.kind in "iu" else \
        np.lexsort((pos, np.asarray(ids, dtype=str), -q))


def _train_kmeans(xn: np.ndarray, n_clusters: int, seed: int):
    """Spherical k-means (faiss) of the unit rows ``xn``; ``.index`` holds the centroids."""
    import faiss

    km = faiss.Kmeans(xn.shape[1], n_clusters, niter=20, seed=seed, spherical=True,
                      verbose=False, min_points_per_centroid=1, max_points_per_centroid=256)
    km.train(xn)
    return km


def _clusters(xn: np.ndarray, n_clusters: int, seed: int, probes: int) -> np.ndarray:
    """(N, probes): each row's nearest centroids (spherical k-means, faiss)."""
    if n_clusters <= 1:
        return np.zeros((xn.shape[0], 1), dtype=np.int64)
    km = _train_kmeans(xn, n_clusters, seed)
    _, assign = km.index.search(xn, min(probes, n_clusters))
    return assign.astype(np.int64)


def _best_above(xm: np.ndarray):
    """(best, arg) for the unit rows ``xm`` of one cluster in rank order: each row's highest
    cosine with a row ranked above it and that row's position (-inf, 0 for the first row),
    computed in row blocks."""
    best = np.full(xm.shape[0], -np.inf, dtype=np.float32)
    arg = np.zeros(xm.shape[0], dtype=np.int64)
    for s in range(0, xm.shape[0], 2048):
        e = min(xm.shape[0], s + 2048)
        sim = xm[s:e] @ xm[:e].T  # (b, e)
        sim[np.arange(e - s)[:, None] <= (np.arange(e)[None, :] - s)] = -np.inf
        a = sim.argmax(axis=1)
        best[s:e] = sim[np.arange(e - s), a]
        arg[s:e] = a
    return best, arg


def deduplicate(x: np.ndarray, q: np.ndarray, ids: np.ndarray, shard_of: np.ndarray,
                row_of: np.ndarray, texts=None, *, exact: bool = True, fuzzy: bool = True,
                near: bool = True, threshold: float = DEFAULT_THRESHOLD,
                containment: float = DEFAULT_CONTAINMENT,
                rows_per_cluster: int = ROWS_PER_CLUSTER, probes: int = 2,
                boilerplate_min_docs: int | None = BOILERPLATE_MIN_DOCS,
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
    keys = (normalised_text_keys(texts, boilerplate_min_docs)
            if texts is not None and (exact or fuzzy) else None)

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
        pairs = _fuzzy_pairs(keys, alive, rank, containment, seed)
        # every pair's worse-ranked row is a duplicate of its better-ranked one
        best_c = {}
        for hi, lo, c in pairs:
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
            # each member against the members ranked above it, in row blocks
            best, arg = _best_above(xa[members])
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
