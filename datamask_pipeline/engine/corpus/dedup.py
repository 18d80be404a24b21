"""Deduplication across the whole corpus, before the selection.

* **Exact**: rows whose normalised text (lower case, whitespace collapsed, trimmed, lines that
  occur in ``boilerplate_min_docs`` or more texts left out) is equal. Rows are grouped on a
  16-byte digest of the key (blake2b), and rows with the same digest are told apart by the key
  itself: memory is 16 bytes a row, whatever the longest text (no rows x text-width array).
* **Fuzzy** (text): MinHash signatures (datasketch) of word 3-gram shingles, banded (LSH) into
  candidate pairs;
  a pair is a duplicate when the smaller text's shingles are contained in the other's at
  ≥ ``containment`` (the same text with a footer, a header or a small edit).
* **Semantic near-duplicates** (SemDeDup's scheme): the unit embeddings of every shard are
  clustered together (faiss spherical k-means, trained on every remaining row up to
  ``kmeans_sample_rows``, else on a seeded uniform sample of that many), and inside each cluster
  a row is a duplicate when a row ranked above it has cosine ≥ ``threshold``. A cluster of more
  than ``max_cluster_rows`` rows is compared in capped pieces (:func:`_cluster_best`), so its
  cost grows linearly with its size instead of quadratically.

Rows are ranked by quality, then id (then shard and row), so the best-quality member of each
group is kept whatever file it came in. Every dropped row names the row it duplicates and why.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field

import numpy as np

__all__ = ["DedupResult", "deduplicate", "normalised_text_keys", "key_digests",
           "kmeans_sample", "pair_containment", "DEFAULT_THRESHOLD", "KMEANS_SAMPLE_ROWS",
           "MAX_CLUSTER_ROWS", "NEAR_MIN_CONTAINMENT", "FUZZY_MIN_SHINGLES", "KINDS"]

DEFAULT_THRESHOLD = 0.99
DEFAULT_CONTAINMENT = 0.8
# the semantic threshold and its text guard, set on the labelled set of bench/dedup.py
# (``python -m bench.dedup labelled``, bench/results/REPORT_dedup_labelled.md, on the vectors
# the corpus stage reads: centered by the corpus's language means): pages built on one
# template around different content embed close together (a web template around one short
# line: 72 % of its pages have another at cosine >= 0.98) while their own text shares nothing.
# So a semantic (cosine) pair whose texts are known is a duplicate only when the smaller
# text's word 3-grams, common (boilerplate) lines left out, are also contained in the other's
# at >= NEAR_MIN_CONTAINMENT: at 0.99 and 0.3 none of 300 template pages is dropped and every
# planted reordered copy is found (0.98 and 0.3 dropped 2 template pages; a guard of 0.5
# missed 4 % of the reordered copies; cosine alone at 0.99 dropped 9, 47 on the model's
# vectors)
NEAR_MIN_CONTAINMENT = 0.3
# a text whose key (common lines left out) has fewer word 3-grams than this is left to the
# exact stage; 1 (every text with a 3-gram): the labelled set shows no gain from more
FUZZY_MIN_SHINGLES = 1
# the kinds of duplicates, as duplicates.parquet's ``kind`` column names them
KINDS = {"exact": "exact", "fuzzy": "fuzzy", "near": "semantic"}
ROWS_PER_CLUSTER = 1000
# a cluster of more rows is compared in pieces of this many (see _cluster_best): a piece costs
# (2 x 10,000)^2 / 2 cosines and 2048 x 20,000 floats (160 MB) at a time
MAX_CLUSTER_ROWS = 10_000
# the k-means is trained on every remaining row up to this many, else on a seeded uniform
# sample of this many (both engines: dedup_ray uses the same rule and constant)
KMEANS_SAMPLE_ROWS = 1_000_000
# shingles hashed per MinHash update: datasketch builds (shingles x NUM_PERM) uint64 arrays,
# 504 MB for the ~500k shingles of a 3 MB text at once, 16 MB per piece of this size
MINHASH_PIECE = 16_384
KEY_DIGEST_BYTES = 16
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
    row: shard, row, dup_of_shard, dup_of_row (the row it duplicates, which passed the test
    with it), kept_shard, kept_row (the row that stays for it: dup_of, or the end of the chain
    when dup_of is itself dropped), reason (``exact``, ``fuzzy`` or ``near``), kind (``exact``,
    ``fuzzy``, ``semantic``) and the pair's evidence, measured for every kind: cosine (of the
    two unit embeddings) and containment (the smaller text's word 3-grams found in the other's,
    common lines left out; 1 for exact; NaN without texts or when a text has no 3-gram)."""

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
    if not text:
        return set()
    w = text.split(" ")
    if len(w) < SHINGLE_WORDS:
        return set()
    return {" ".join(w[i:i + SHINGLE_WORDS]) for i in range(len(w) - SHINGLE_WORDS + 1)}


def _minhash(base, shingles: set) -> np.ndarray:
    """The NUM_PERM MinHash values (uint32) of one text's shingles: ``base`` (an empty datasketch
    MinHash) updated ``MINHASH_PIECE`` shingles at a time, so a long text's temporaries stay
    small (the minimum over pieces is the minimum over the whole set)."""
    m = base.copy()
    it = iter(shingles)
    while True:
        piece = [x.encode("utf-8", "surrogatepass") for _, x in zip(range(MINHASH_PIECE), it)]
        if not piece:
            return m.hashvalues.astype(np.uint32)
        m.update_batch(piece)


def pair_containment(a: str | None, b: str | None) -> float:
    """The share of the smaller of two keys' word 3-grams found in the other's (NaN when one
    has none): the evidence both engines record for a pair."""
    sa, sb = _shingles(a), _shingles(b)
    if not sa or not sb:
        return float("nan")
    return len(sa & sb) / min(len(sa), len(sb))


def _signatures(keys: np.ndarray, rows: np.ndarray, seed: int,
                min_shingles: int = FUZZY_MIN_SHINGLES):
    """(rows with at least ``min_shingles`` shingles, (m, NUM_PERM) uint32 MinHash
    signatures): one text's shingles at a time (held only while it is hashed), the
    signatures kept as one array."""
    from datasketch import MinHash

    base = MinHash(num_perm=NUM_PERM, seed=seed + 1)
    have, sig = [], np.zeros((rows.size, NUM_PERM), dtype=np.uint32)
    for r in rows.tolist():
        sh = _shingles(keys[r]) if keys[r] else None
        if sh and len(sh) >= max(1, min_shingles):
            sig[len(have)] = _minhash(base, sh)
            have.append(r)
    return np.asarray(have, dtype=np.int64), sig[:len(have)].copy()


def _fuzzy_pairs(keys: np.ndarray, rows: np.ndarray, rank: np.ndarray, containment: float,
                 seed: int, min_shingles: int = FUZZY_MIN_SHINGLES) -> list:
    """(worse, better, containment): LSH bands of the MinHash signatures (BANDS bands of
    BAND_ROWS values: pairs at Jaccard ~0.3 and up are likely to share a band) propose each
    row's best-ranked band mate and the next better-ranked one; the pair is kept when the smaller text's shingles are
    contained in the other's at >= ``containment``. Memory: the signatures, 4 bytes x
    NUM_PERM per text."""
    have, sig = _signatures(keys, rows, seed, min_shingles)
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
    out, held, held_sh = [], -1, None
    # by better row, so that a row that many rows pair with (the head of large buckets, a long
    # text) is cut into shingles once; a worse row is in at most 2 x BANDS pairs
    for better, worse in sorted((b, w) for w, b in cand):
        if better != held:
            held, held_sh = better, _shingles(keys[better])
        a = _shingles(keys[worse])
        c = len(a & held_sh) / min(len(a), len(held_sh))
        if c >= containment:
            out.append((worse, better, c))
    # in (worse, better) order: of two partners at the same containment the first in the
    # corpus's (shard, row) order is named, whatever the set's order (dedup_ray does the same)
    return sorted(out)


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


def kmeans_sample(n: int, sample_rows: int, seed: int):
    """Which of ``n`` remaining rows (in corpus order) train the k-means: None (all of them)
    while ``n <= sample_rows``, else the sorted positions of a uniform sample of
    ``sample_rows`` drawn with ``seed``. Both engines take this sample, so they train the same
    centroids."""
    if n <= sample_rows:
        return None
    return np.sort(np.random.default_rng(seed).choice(n, size=sample_rows, replace=False))


def _clusters(xn: np.ndarray, n_clusters: int, seed: int, probes: int,
              sample: np.ndarray | None = None) -> np.ndarray:
    """(N, probes): each row's nearest centroids (spherical k-means, faiss, trained on the rows
    at ``sample`` when given, else on all)."""
    if n_clusters <= 1:
        return np.zeros((xn.shape[0], 1), dtype=np.int64)
    km = _train_kmeans(xn if sample is None else np.ascontiguousarray(xn[sample]),
                       n_clusters, seed)
    _, assign = km.index.search(xn, min(probes, n_clusters))
    return assign.astype(np.int64)


def _cluster_members(assign: np.ndarray):
    """Each cluster's members (row positions, ascending), clusters in ascending order, from the
    (N, probes) nearest-centroid table: one sort of the table (a scan per cluster would cost
    clusters x N)."""
    if assign.size == 0:
        return
    rows = np.repeat(np.arange(assign.shape[0]), assign.shape[1])
    flat = assign.ravel()
    order = np.lexsort((rows, flat))
    c, r = flat[order], rows[order]
    new = np.r_[True, (c[1:] != c[:-1]) | (r[1:] != r[:-1])]  # a row twice in one cluster: once
    c, r = c[new], r[new]
    cuts = np.flatnonzero(np.r_[True, c[1:] != c[:-1], True])
    for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist()):
        yield r[a:b]


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


def _cluster_best(xm: np.ndarray, cap: int = MAX_CLUSTER_ROWS):
    """:func:`_best_above` for one cluster's unit rows ``xm`` in rank order, with the cost
    capped: up to ``cap`` rows, every row against every row ranked above it. Beyond, the first
    ``cap`` rows (the cluster's best ranked: its anchors) are compared among themselves, and the
    later rows in pieces of ``cap``, each row against the anchors and the rows of its own piece
    ranked above it. A cluster of near-identical rows is still found whole (every row is near
    an anchor); only a pair of rows in two different later pieces, near each other but not
    near an anchor, is missed. Cost: O(m x cap) cosines, memory O(cap) rows per block."""
    m = xm.shape[0]
    if m <= cap:
        return _best_above(xm)
    best, arg = np.empty(m, dtype=np.float32), np.empty(m, dtype=np.int64)
    best[:cap], arg[:cap] = _best_above(xm[:cap])
    for s in range(cap, m, cap):
        e = min(m, s + cap)
        b, a = _best_above(np.concatenate([xm[:cap], xm[s:e]]))
        a = a[cap:]
        best[s:e], arg[s:e] = b[cap:], np.where(a < cap, a, a - cap + s)
    return best, arg


def key_digests(keys) -> np.ndarray:
    """A fixed-size digest (blake2b, ``KEY_DIGEST_BYTES`` bytes, as one numpy void value) of each
    text key: what exact deduplication groups on, 16 bytes a row whatever the text's length."""
    blob = b"".join(hashlib.blake2b(k.encode("utf-8", "surrogatepass"),
                                    digest_size=KEY_DIGEST_BYTES).digest() for k in keys)
    return np.frombuffer(blob, dtype=np.dtype((np.void, KEY_DIGEST_BYTES)))


def _exact_dups(keys: np.ndarray, rank: np.ndarray):
    """(rows, heads): every row whose non-empty key equals a better-ranked row's, and the
    best-ranked row of its key. Rows are sorted on (key digest, rank); only rows that share a
    digest are compared on the key itself (so even a digest collision keeps distinct texts
    apart)."""
    idx = np.flatnonzero(np.fromiter((k is not None and k != "" for k in keys), dtype=bool,
                                     count=len(keys)))
    if idx.size < 2:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    _, inv = np.unique(key_digests(keys[idx]), return_inverse=True)
    order = np.lexsort((rank[idx], inv.ravel()))
    g, r = inv.ravel()[order], idx[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1], True])
    rows, heads = [], []
    for a, b in zip(starts[:-1].tolist(), starts[1:].tolist()):
        if b - a < 2:
            continue
        head = {}
        for row in r[a:b].tolist():  # best ranked first: the first of each key stays
            h = head.setdefault(keys[row], row)
            if h != row:
                rows.append(row)
                heads.append(h)
    return np.asarray(rows, dtype=np.int64), np.asarray(heads, dtype=np.int64)


def pair_cosine(a: np.ndarray, b: np.ndarray) -> float:
    """The cosine of two embeddings (float32, each scaled to unit length as the semantic
    stage does): the evidence both engines record for an exact or fuzzy pair."""
    u = np.stack([np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32)])
    u /= np.maximum(np.linalg.norm(u, axis=1, keepdims=True), 1e-30)
    return float(np.dot(u[0], u[1]))


def pair_evidence_containment(reason: str, keys, i: int, j: int) -> float:
    """The containment recorded for a dropped pair: 1 for an exact one (equal keys), the
    keys' 3-gram containment otherwise, NaN without texts."""
    if keys is None:
        return float("nan")
    return 1.0 if reason == "exact" else pair_containment(keys[i], keys[j])


def kept_rows(dup_of: np.ndarray) -> np.ndarray:
    """Each row's kept row: itself when kept, else the end of its chain of duplicates (every
    link points to a better-ranked row, so chains end)."""
    kept = np.arange(dup_of.size)
    for i in np.flatnonzero(dup_of >= 0).tolist():
        j = i
        while dup_of[j] >= 0:
            j = int(dup_of[j])
        kept[i] = j
    return kept


def deduplicate(x: np.ndarray, q: np.ndarray, ids: np.ndarray, shard_of: np.ndarray,
                row_of: np.ndarray, texts=None, *, exact: bool = True, fuzzy: bool = True,
                near: bool = True, threshold: float = DEFAULT_THRESHOLD,
                containment: float = DEFAULT_CONTAINMENT,
                rows_per_cluster: int = ROWS_PER_CLUSTER, probes: int = 2,
                boilerplate_min_docs: int | None = BOILERPLATE_MIN_DOCS,
                seed: int = 0, kmeans_sample_rows: int = KMEANS_SAMPLE_ROWS,
                max_cluster_rows: int = MAX_CLUSTER_ROWS,
                near_containment: float = NEAR_MIN_CONTAINMENT,
                fuzzy_min_shingles: int = FUZZY_MIN_SHINGLES) -> DedupResult:
    """Deduplicate the corpus given as concatenated arrays: embeddings ``x`` (N, d), quality,
    ids, each row's shard index and row number, and optionally its text (for exact
    duplicates). Each row is compared inside its ``probes`` nearest clusters (2: a pair split
    by a cluster boundary is still found); the k-means is trained on at most
    ``kmeans_sample_rows`` rows (:func:`kmeans_sample`) and a cluster of more than
    ``max_cluster_rows`` members is compared in capped pieces (:func:`_cluster_best`). With
    texts, a semantic pair is a duplicate only when its texts' containment (common lines left
    out) is also >= ``near_containment``; a text with fewer than ``fuzzy_min_shingles`` word
    3-grams is left to the exact stage. Returns per-shard keep masks and the dropped rows with
    their lineage and evidence (:class:`DedupResult`)."""
    if max_cluster_rows < 1 or kmeans_sample_rows < 1:
        raise ValueError(f"max_cluster_rows ({max_cluster_rows}) and kmeans_sample_rows "
                         f"({kmeans_sample_rows}) must be at least 1")
    t0 = time.perf_counter()
    n = int(x.shape[0])
    rank = _rank(np.asarray(q, dtype=np.float64), np.asarray(ids))
    dup_of = np.full(n, -1, dtype=np.int64)
    reason = np.empty(n, dtype=object)
    cosine = np.full(n, np.nan)
    stats = {"rows": n, "threshold": threshold, "exact": exact, "fuzzy": fuzzy,
             "containment": containment, "near": near, "near_containment": near_containment,
             "fuzzy_min_shingles": fuzzy_min_shingles}
    # the texts' keys: for exact and fuzzy, and for the semantic stage's text guard
    keys = (normalised_text_keys(texts, boilerplate_min_docs)
            if texts is not None and (exact or fuzzy or (near and near_containment > 0))
            else None)

    if exact and keys is not None:
        rows, heads = _exact_dups(keys, rank)
        dup_of[rows], reason[rows], cosine[rows] = heads, "exact", 1.0
        stats["exact_dropped"] = int(rows.size)
    elif exact:
        stats["exact_skipped"] = "no text column"

    if fuzzy and keys is not None:
        alive = np.flatnonzero(dup_of < 0)
        pairs = _fuzzy_pairs(keys, alive, rank, containment, seed, fuzzy_min_shingles)
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
        sample = kmeans_sample(alive.size, kmeans_sample_rows, seed) if k > 1 else None
        assign = _clusters(xa, k, seed, probes, sample)
        stats["clusters"] = k
        if k > 1:
            stats["kmeans_sample"] = int(alive.size if sample is None else sample.size)
        sizes = []
        for members in _cluster_members(assign):
            sizes.append(members.size)
            if members.size < 2:
                continue
            members = members[np.argsort(rank[alive[members]], kind="stable")]
            # each member against the members ranked above it (capped pieces, row blocks)
            best, arg = _cluster_best(xa[members], max_cluster_rows)
            hit = np.flatnonzero(best >= threshold)
            rows = alive[members[hit]]
            better = np.isnan(cosine[rows]) | (best[hit] > cosine[rows])  # seen in 2 clusters
            rows, hit = rows[better], hit[better]
            dup_of[rows] = alive[members[arg[hit]]]
            reason[rows] = "near"
            cosine[rows] = best[hit]
        if keys is not None and near_containment > 0:  # the text guard: own text overlaps too
            rows = np.flatnonzero(reason == "near")
            veto = [r for r in rows.tolist()
                    if not pair_containment(keys[r], keys[dup_of[r]]) >= near_containment]
            dup_of[veto], reason[veto], cosine[veto] = -1, None, np.nan
            stats["near_text_vetoed"] = len(veto)
        stats["near_dropped"] = int((reason == "near").sum())
        stats["largest_cluster"] = int(max(sizes, default=0))
        stats["clusters_capped"] = int(sum(m > max_cluster_rows for m in sizes))

    drop = np.flatnonzero(dup_of >= 0)
    keep = dup_of < 0
    kept = kept_rows(dup_of)
    dropped = []
    for i in drop.tolist():
        j, why = int(dup_of[i]), str(reason[i])
        dropped.append({
            "shard": int(shard_of[i]), "row": int(row_of[i]),
            "dup_of_shard": int(shard_of[j]), "dup_of_row": int(row_of[j]),
            "kept_shard": int(shard_of[kept[i]]), "kept_row": int(row_of[kept[i]]),
            "reason": why, "kind": KINDS[why],
            "cosine": float(cosine[i]) if why == "near" else pair_cosine(x[i], x[j]),
            "containment": pair_evidence_containment(why, keys, i, j)})
    n_shards = int(shard_of.max()) + 1 if n else 0
    masks = [keep[shard_of == s] for s in range(n_shards)]
    stats.update(dropped=int(drop.size), kept=int(keep.sum()),
                 dropped_fraction=float(drop.size / max(1, n)),
                 seconds=time.perf_counter() - t0)
    return DedupResult(keep=masks, dropped=dropped, stats=stats)
