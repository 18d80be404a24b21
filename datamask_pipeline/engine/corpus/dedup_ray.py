"""The corpus-wide deduplication of :func:`dedup.deduplicate` as a Ray Data pipeline.

Same rules, same result (keep masks and dropped rows with their lineage), but the corpus-wide
steps run on a Ray cluster instead of one process holding every row:

* each parquet row group of every shard is a Ray task (features: id, quality, embedding,
  centered by the corpus's language means when the footers record language sums, as the
  selection reads them, ``engine.embed.LanguageSums``; raw: the text column, with the
  features' id and quality of the same rows);
* boilerplate lines: every text's distinct lines, counted with ``groupby(line).count()``;
* exact: ``groupby(16-byte blake2b digest of the normalised key).map_groups``
  (:func:`dedup.key_digests`), the best-ranked row of each equal key stays;
* fuzzy: MinHash signatures per batch (``map_batches``), one record per LSH band,
  ``groupby(band bucket).map_groups`` proposes each row's best-ranked and next better-ranked
  band mate; the pair's two texts are brought together by ``groupby(row)`` (a join of the
  pair halves with the texts) and ``groupby(pair)`` checks the shingle containment;
* near: the k-means centroids are trained in the driver (faiss, on the alive rows in global
  order while there are at most ``kmeans_sample_rows``, else on the seeded uniform sample of
  :func:`dedup.kmeans_sample`, the embedded path's), every row is assigned to its ``probes``
  nearest centroids by ``map_batches``, and ``groupby(cluster).map_groups`` compares each
  member with the members ranked above it (a cluster over ``max_cluster_rows`` in capped
  pieces, :func:`dedup._cluster_best`).

What reaches the driver: the shards' parquet footers, the boilerplate line set, the k-means
training sample, and the per-row outcome (one bit per row of "already dropped", and the
dropped rows with their lineage, which is the result); the sample is picked by the driver and
sent to the tasks as one bit per row. Rows are ranked by the tuple
(-quality, id as text, shard, row) -- :func:`dedup._rank` on ids given as text, as
``corpus_dedup`` gives them.

When a fuzzy row has two partners at exactly the same highest containment, both paths name
the one first in (shard, row) order.

Needs ``ray[data]`` (the ``ray`` extra); imported only when called. No Dagster here.
"""

from __future__ import annotations

import functools
import json
import re
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from .. import storage
from ..data import RULE_EMB_NULL, RULE_EMB_RAGGED, RULE_ID_NULL, RULE_PRESENT, RULE_Q_NULL, RULE_READABLE, RAW_ROW
from ..embed import LANGUAGE_COLUMN, LanguageSums
from ..errors import DataContractError
from .dedup import (BAND_ROWS, BANDS, BOILERPLATE_MIN_DOCS, DEFAULT_CONTAINMENT,
                    DEFAULT_THRESHOLD, FUZZY_MIN_SHINGLES, KINDS, KMEANS_SAMPLE_ROWS,
                    MAX_CLUSTER_ROWS, NEAR_MIN_CONTAINMENT, ROWS_PER_CLUSTER, DedupResult,
                    _cluster_best, _distinct_lines, _doc_lines, _normalise, _rank_order,
                    _shingles, _signatures, _strip_lines, _train_kmeans, kept_rows,
                    key_digests, kmeans_sample, pair_containment, pair_cosine)

__all__ = ["ShardSource", "deduplicate_ray", "RULE_TEXT_ROWS"]

RULE_TEXT_ROWS = "raw rows match the features rows"
_REASONS = np.array([None, "exact", "fuzzy", "near"], dtype=object)
_EXACT, _FUZZY, _NEAR = 1, 2, 3
# a DataContractError raised in a Ray task reaches the driver only as text (Ray Data wraps
# the task's exception and does not keep its cause): its fields travel in the message
_MARK = "@@datamask-contract@@"
_FIELDS = ("file", "rule", "column", "ids", "count", "detail", "rows")


def _reported(fn):
    """A Ray task body whose contract errors the driver can raise again as such."""
    @functools.wraps(fn)
    def run(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except DataContractError as exc:
            fields = json.dumps({k: getattr(exc, k) for k in _FIELDS}, default=str)
            raise RuntimeError(f"{exc}\n{_MARK}{fields}{_MARK}") from exc
    return run


def _contract_error(exc: BaseException):
    """The DataContractError whose fields a failed Ray task carried in its message, or None."""
    m = re.search(re.escape(_MARK) + r"(.*?)" + re.escape(_MARK), str(exc), re.S)
    if not m:
        return None
    try:
        f = json.loads(m.group(1))
    except ValueError:
        return None
    return DataContractError(f["file"], f["rule"], column=f["column"], ids=f["ids"],
                             count=f["count"], detail=f["detail"], rows=f["rows"])


@dataclass(frozen=True)
class ShardSource:
    """Where one shard's rows come from: its features parquet (id, quality, embedding as a
    list of float32) and, for exact and fuzzy duplicates, its raw parquet and text column
    (row i of the raw file is row i of the features, or the features' ``raw_row`` where
    ingestion quarantined rows). A shard's index is its position in the
    list given to :func:`deduplicate_ray`."""

    features: str
    raw: str | None = None
    text_column: str | None = None


@dataclass(frozen=True)
class _Cols:
    id: str = "id"
    quality: str = "quality"
    embedding: str = "embedding"


# ------------------------------------------------------------------ the driver's plan
def _open(uri) -> pq.ParquetFile:
    try:
        fs, path = storage.resolve(uri)
        return pq.ParquetFile(fs.open_input_file(path))
    except (OSError, pa.ArrowException, ValueError) as exc:
        raise DataContractError(uri, RULE_READABLE, detail=str(exc)) from exc


def _need(pf: pq.ParquetFile, uri, names, why: str) -> None:
    have = pf.schema_arrow.names
    for name in names:
        if name not in have:
            raise DataContractError(uri, RULE_PRESENT, column=name,
                                    detail=f"{why}; available columns: {have}")


def _groups(pf: pq.ParquetFile) -> list:
    """[(first row, rows)] of each row group."""
    out, start = [], 0
    for g in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(g).num_rows
        out.append((start, n))
        start += n
    return out


def _plan(shards, cols: _Cols, texts_wanted: bool, texts_optional: bool = False):
    """(row offsets of the shards, feature read items, text read items or None, the corpus's
    language sums or None): parquet footers only; every file and column is checked here,
    before Ray runs anything. Texts
    ``texts_optional`` (the semantic stage's text guard alone) are read when every shard has
    them, and left out otherwise."""
    if not shards:
        return np.zeros(1, dtype=np.int64), [], None, None
    with_text = [s.raw is not None and s.text_column is not None for s in shards]
    if texts_optional and not texts_wanted:
        texts_wanted = all(with_text)
    if texts_wanted and any(with_text) and not all(with_text):
        missing = [i for i, w in enumerate(with_text) if not w]
        raise ValueError(f"exact/fuzzy deduplication needs every shard's raw file and text "
                         f"column, or none; shard(s) {missing[:10]} have none "
                         f"(e.g. {shards[missing[0]].features})")
    texts_wanted = texts_wanted and all(with_text)
    offsets, feat_items, text_items, sums = [0], [], [] if texts_wanted else None, []
    for i, s in enumerate(shards):
        pf = _open(s.features)
        _need(pf, s.features, (cols.id, cols.quality, cols.embedding), "the features of the dedup")
        sums.append(LanguageSums.from_footer(pf.schema_arrow.metadata))
        if sums[-1] is not None:
            _need(pf, s.features, (LANGUAGE_COLUMN,), "the footer records language sums")
        groups = _groups(pf)
        n = pf.metadata.num_rows
        for start, rows in groups:
            feat_items.append({"uri": str(s.features), "start": start, "rows": rows,
                               "gid": offsets[-1] + start, "centered": sums[-1] is not None})
        if texts_wanted:
            rf = _open(s.raw)
            _need(rf, s.raw, (s.text_column,), "the text of exact and fuzzy deduplication")
            # ingestion quarantined rows: the features carry each row's raw row number
            # (engine.data.RAW_ROW), and the texts are read at those rows, by features group
            mapped = RAW_ROW in pf.schema_arrow.names
            if not mapped and rf.metadata.num_rows != n:
                raise DataContractError(s.raw, RULE_TEXT_ROWS, column=s.text_column,
                                        detail=f"{rf.metadata.num_rows} raw rows, {n} rows in "
                                               f"{s.features}")
            for start, rows in (groups if mapped else _groups(rf)):
                text_items.append({"uri": str(s.raw), "column": s.text_column,
                                   "features": str(s.features), "start": start, "rows": rows,
                                   "gid": offsets[-1] + start, "mapped": mapped})
        offsets.append(offsets[-1] + n)
    return np.asarray(offsets, dtype=np.int64), feat_items, text_items, LanguageSums.total(sums)


# ------------------------------------------------------------------ row-group reads (tasks)
def _read_rows(uri, columns, start: int, rows: int) -> pa.Table:
    """Rows [start, start + rows) of ``uri`` (the row groups that hold them)."""
    pf = _open(uri)
    groups, want = _groups(pf), []
    for g, (s, n) in enumerate(groups):
        if s < start + rows and s + n > start:
            want.append(g)
    t = pf.read_row_groups(want, columns=list(columns))
    return t.slice(start - groups[want[0]][0], rows) if want else t.slice(0, 0)


def _rank_cols(t: pa.Table, uri, cols: _Cols, gid0: int) -> dict:
    ids, q = t.column(cols.id), t.column(cols.quality)
    for col, name, rule in ((ids, cols.id, RULE_ID_NULL), (q, cols.quality, RULE_Q_NULL)):
        if col.null_count:
            bad = np.flatnonzero(pc.is_null(col).to_numpy(zero_copy_only=False))
            raise DataContractError(uri, rule, column=name, count=int(bad.size),
                                    rows=(bad[:10] + gid0).tolist())
    return {"gid": np.arange(gid0, gid0 + t.num_rows, dtype=np.int64),
            "q": pc.cast(q, pa.float64(), safe=False).to_numpy(),
            "id": pc.cast(ids, pa.string()).to_numpy(zero_copy_only=False)}


@_reported
def _read_features(batch: dict, cols: _Cols, dim: int | None, language_sums=None) -> dict:
    """A row group's id, quality and embedding; a shard whose footer records language sums
    has its vectors centered by ``language_sums`` (the corpus's)."""
    (uri,), (start,), (rows,), (gid,) = batch["uri"], batch["start"], batch["rows"], batch["gid"]
    centered = bool(batch["centered"][0])
    t = _read_rows(uri, (cols.id, cols.quality, cols.embedding)
                   + ((LANGUAGE_COLUMN,) if centered else ()), int(start), int(rows))
    out = _rank_cols(t, uri, cols, int(start))
    out["gid"] += int(gid) - int(start)
    emb = t.column(cols.embedding).combine_chunks()
    if emb.null_count:
        bad = np.flatnonzero(pc.is_null(emb).to_numpy(zero_copy_only=False))
        raise DataContractError(uri, RULE_EMB_NULL, column=cols.embedding, count=int(bad.size),
                                rows=(bad[:10] + int(start)).tolist())
    lengths = pc.list_value_length(emb).to_numpy(zero_copy_only=False)
    d = int(dim) if dim is not None else (int(lengths[0]) if lengths.size else 0)
    if (lengths != d).any():
        bad = np.flatnonzero(lengths != d)
        raise DataContractError(uri, RULE_EMB_RAGGED, column=cols.embedding, count=int(bad.size),
                                rows=(bad[:10] + int(start)).tolist(),
                                detail=f"expected length {d}, found {sorted(set(lengths[bad].tolist()))[:5]}")
    out["emb"] = pc.cast(emb.flatten(), pa.float32()).to_numpy().reshape(len(lengths), d)
    if centered:
        out["emb"] = language_sums.centering(t.column(LANGUAGE_COLUMN)).apply(out["emb"])
    return out


@_reported
def _read_texts(batch: dict, cols: _Cols) -> pa.Table:
    (uri,), (column,), (feat,) = batch["uri"], batch["column"], batch["features"]
    start, rows, gid = int(batch["start"][0]), int(batch["rows"][0]), int(batch["gid"][0])
    if bool(batch["mapped"][0]):  # features rows [start, start + rows) at their raw rows
        f = _read_rows(feat, (cols.id, cols.quality, RAW_ROW), start, rows)
        raw = f.column(RAW_ROW).to_numpy()
        lo = int(raw[0]) if raw.size else 0
        span = _read_rows(uri, (column,), lo, int(raw[-1]) + 1 - lo if raw.size else 0)
        text = span.column(column).take(pa.array(raw - lo))
    else:
        f = _read_rows(feat, (cols.id, cols.quality), start, rows)
        text = _read_rows(uri, (column,), start, rows).column(column)
    rank = _rank_cols(f, feat, cols, start)
    return pa.table({"gid": pa.array(rank["gid"] + (gid - start)), "q": pa.array(rank["q"]),
                     "id": pa.array(rank["id"], pa.string()),
                     "text": pc.cast(text, pa.large_string())})


# ------------------------------------------------------------------ per-batch and per-group steps
def _bit(gid: np.ndarray, packed) -> np.ndarray:
    """Each row's bit in a bit-packed per-row mask (``np.packbits`` order)."""
    import ray

    if isinstance(packed, ray.ObjectRef):
        packed = ray.get(packed)
    return ((packed[gid >> 3] >> (7 - (gid & 7)).astype(np.uint8)) & 1) == 1


def _alive(gid: np.ndarray, packed) -> np.ndarray:
    """Whether each row is still alive, from the bit-packed "dropped" mask."""
    return ~_bit(gid, packed)


def _sampled_batch(batch: dict, packed) -> dict:
    """The rows of the k-means training sample (their bit set in ``packed``)."""
    keep = _bit(batch["gid"], packed)
    return {"gid": batch["gid"][keep], "emb": batch["emb"][keep]}


def _line_batch(t: pa.Table) -> pa.Table:
    lines = [ln for text in t.column("text").to_pylist() for ln in _distinct_lines(_doc_lines(text))]
    return pa.table({"line": pa.array(lines, pa.large_string())})


def _common_batch(t: pa.Table, min_docs: int) -> pa.Table:
    return t.filter(pc.greater_equal(t.column("count()"), min_docs)).select(["line"])


def _key_batch(t: pa.Table, common) -> pa.Table:
    import ray

    if isinstance(common, ray.ObjectRef):
        common = ray.get(common)
    keys = _normalise(_strip_lines(t.column("text"), common))
    return t.drop_columns(["text"]).append_column("key", pa.array(keys.tolist(), pa.large_string()))


def _hash_batch(t: pa.Table) -> pa.Table:
    """The rows with a non-empty key and the key's digest ``h`` (16 bytes, as hex text)."""
    keys = t.column("key").to_pylist()
    ok = np.array([k is not None and k != "" for k in keys], dtype=bool)
    t = t.filter(pa.array(ok))
    h = [v.tobytes().hex() for v in key_digests([k for k, o in zip(keys, ok) if o])]
    return t.append_column("h", pa.array(h, pa.string()))


def _order(g: dict) -> np.ndarray:
    return _rank_order(np.asarray(g["q"], dtype=np.float64), np.asarray(g["id"], dtype=object),
                       np.asarray(g["gid"], dtype=np.int64))


_DUPS = pa.schema([("gid", pa.int64()), ("dup", pa.int64())])
_PAIRS = pa.schema([("w", pa.int64()), ("b", pa.int64())])
_VERIFIED = pa.schema([("w", pa.int64()), ("b", pa.int64()), ("c", pa.float64())])
_NEAR_HITS = pa.schema([("gid", pa.int64()), ("dup", pa.int64()), ("cos", pa.float32()),
                        ("cluster", pa.int64())])


def _table(schema: pa.Schema, **cols) -> pa.Table:
    """Group results with a fixed schema (empty groups too), so that blocks concatenate."""
    return pa.table({f.name: pa.array(np.asarray(cols[f.name]) if f.type != pa.large_string()
                                      else list(cols[f.name]), f.type) for f in schema},
                    schema=schema)


def _exact_group(g: dict) -> pa.Table:
    """Rows with equal normalised text (one digest bucket, split by the text itself): every
    row but the best-ranked is a duplicate of it."""
    o = _order(g)
    keys, gid = np.asarray(g["key"], dtype=object)[o], np.asarray(g["gid"])[o]
    head, dup, rows = {}, [], []
    for k, r in zip(keys.tolist(), gid.tolist()):
        if k in head:
            rows.append(r)
            dup.append(head[k])
        else:
            head[k] = r
    return _table(_DUPS, gid=np.asarray(rows, dtype=np.int64), dup=np.asarray(dup, dtype=np.int64))


def _band_batch(t: pa.Table, packed, seed: int, min_shingles: int) -> pa.Table:
    """One record per LSH band of each alive row with at least ``min_shingles`` shingles:
    bucket = band + its values."""
    gid = t.column("gid").to_numpy()
    keys = np.asarray(t.column("key").to_pylist(), dtype=object)
    alive = np.flatnonzero(_alive(gid, packed))
    have, sig = _signatures(keys, alive, seed, min_shingles)
    m = have.size
    bands = sig.reshape(m, BANDS, BAND_ROWS)
    bucket = [f"{b}:{bands[i, b].tobytes().hex()}" for i in range(m) for b in range(BANDS)]
    rep = np.repeat(have, BANDS)
    return pa.table({"bucket": pa.array(bucket, pa.string()),
                     "gid": pa.array(gid[rep]),
                     "q": t.column("q").take(pa.array(rep)),
                     "id": t.column("id").take(pa.array(rep))})


def _band_group(g: dict) -> pa.Table:
    """One LSH bucket in rank order: each row's best-ranked mate and its next better-ranked."""
    if len(g["gid"]) < 2:
        return _PAIRS.empty_table()
    gid = np.asarray(g["gid"], dtype=np.int64)[_order(g)]
    return _table(_PAIRS, w=np.r_[gid[1:], gid[1:]],
                  b=np.r_[np.full(gid.size - 1, gid[0]), gid[:-1]])


_HALF = pa.schema([("gid", pa.int64()), ("w", pa.int64()), ("b", pa.int64()),
                   ("side", pa.int8()), ("key", pa.large_string())])


def _halves_batch(t: pa.Table) -> pa.Table:
    """Each candidate pair as two halves, one to meet each row's text."""
    w, b = t.column("w").to_numpy(), t.column("b").to_numpy()
    n = w.size
    return pa.table({"gid": np.r_[w, b], "w": np.r_[w, w], "b": np.r_[b, b],
                     "side": np.r_[np.zeros(n, np.int8), np.ones(n, np.int8)],
                     "key": pa.nulls(2 * n, pa.large_string())}, schema=_HALF)


def _texts_batch(t: pa.Table, packed) -> pa.Table:
    gid = t.column("gid").to_numpy()
    t = t.filter(pa.array(_alive(gid, packed)))
    n = t.num_rows
    return pa.table({"gid": t.column("gid"), "w": pa.array(np.full(n, -1, np.int64)),
                     "b": pa.array(np.full(n, -1, np.int64)),
                     "side": pa.array(np.full(n, -1, np.int8)), "key": t.column("key")},
                    schema=_HALF)


def _attach_group(g: dict) -> pa.Table:
    """One row's text and the halves of its candidate pairs (each once): the text travels
    with each half."""
    side = np.asarray(g["side"])
    is_text = side < 0
    if not is_text.any() or is_text.all():
        return _HALF.empty_table()
    key = np.asarray(g["key"], dtype=object)[is_text][0]
    halves = np.unique(np.stack([np.asarray(g["w"])[~is_text], np.asarray(g["b"])[~is_text],
                                 side[~is_text].astype(np.int64)], axis=1), axis=0)
    m = halves.shape[0]
    return _table(_HALF, gid=np.asarray(g["gid"][:1].repeat(m), dtype=np.int64),
                  w=halves[:, 0], b=halves[:, 1], side=halves[:, 2].astype(np.int8),
                  key=[key] * m)


def _containment_group(g: dict, containment: float) -> pa.Table:
    """One candidate pair with both texts: kept when the smaller text's shingles are contained
    in the other's at >= ``containment``."""
    side = np.asarray(g["side"])
    keys = np.asarray(g["key"], dtype=object)
    if not ((side == 0).any() and (side == 1).any()):
        return _VERIFIED.empty_table()
    a, b = _shingles(keys[side == 0][0]), _shingles(keys[side == 1][0])
    c = len(a & b) / min(len(a), len(b))
    if c < containment:
        return _VERIFIED.empty_table()
    return _table(_VERIFIED, w=np.asarray(g["w"][:1]), b=np.asarray(g["b"][:1]), c=[c])


def _unit_batch(batch: dict, packed) -> dict:
    """The alive rows with their embeddings scaled to unit length (as ``deduplicate`` does)."""
    keep = _alive(batch["gid"], packed)
    x = np.ascontiguousarray(batch["emb"][keep], dtype=np.float32)
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-30)
    return {"gid": batch["gid"][keep], "q": batch["q"][keep], "id": batch["id"][keep], "emb": x}


def _assign_batch(batch: dict, index_bytes, probes: int) -> dict:
    """Each row once per nearest centroid (``probes`` of them), as ``cluster`` records."""
    import faiss
    import ray

    if isinstance(index_bytes, ray.ObjectRef):
        index_bytes = ray.get(index_bytes)
    n = len(batch["gid"])
    if index_bytes is None:
        assign = np.zeros((n, 1), dtype=np.int64)
    else:
        index = faiss.deserialize_index(index_bytes)
        # the BLAS inner products for every batch size, as the one big search of the
        # embedded path (faiss takes another code path below 20 queries)
        old = faiss.cvar.distance_compute_blas_threshold
        faiss.cvar.distance_compute_blas_threshold = 0
        try:
            _, assign = index.search(np.ascontiguousarray(batch["emb"], dtype=np.float32), probes)
        finally:
            faiss.cvar.distance_compute_blas_threshold = old
        assign = assign.astype(np.int64)
    p = assign.shape[1]
    rep = np.repeat(np.arange(n), p)
    return {"cluster": assign.reshape(-1), "gid": batch["gid"][rep], "q": batch["q"][rep],
            "id": batch["id"][rep], "emb": batch["emb"][rep]}


def _near_group(g: dict, threshold: float, cap: int) -> pa.Table:
    """One cluster in rank order: a member is a duplicate of its most similar better-ranked
    member when their cosine is >= ``threshold`` (a cluster over ``cap`` rows in capped
    pieces, as the embedded path)."""
    if len(g["gid"]) < 2:
        return _NEAR_HITS.empty_table()
    o = _order(g)
    gid = np.asarray(g["gid"])[o]
    best, arg = _cluster_best(np.ascontiguousarray(np.asarray(g["emb"])[o], dtype=np.float32),
                              cap)
    hit = np.flatnonzero(best >= threshold)
    return _table(_NEAR_HITS, gid=gid[hit], dup=gid[arg[hit]], cos=best[hit].astype(np.float32),
                  cluster=np.full(hit.size, int(g["cluster"][0]), dtype=np.int64))


# the evidence of each dropped pair: its two rows' keys and embeddings brought together
_EV = pa.schema([("gid", pa.int64()), ("w", pa.int64()), ("b", pa.int64()),
                 ("side", pa.int8()), ("key", pa.large_string()),
                 ("emb", pa.list_(pa.float32()))])
_EVIDENCE = pa.schema([("w", pa.int64()), ("b", pa.int64()), ("containment", pa.float64()),
                       ("cosine", pa.float64())])
_TEXT_SIDE, _EMB_SIDE = -1, -2


def _ev_halves(w: np.ndarray, b: np.ndarray) -> pa.Table:
    n = w.size
    return pa.table({"gid": pa.array(np.r_[w, b]), "w": pa.array(np.r_[w, w]),
                     "b": pa.array(np.r_[b, b]),
                     "side": pa.array(np.r_[np.zeros(n, np.int8), np.ones(n, np.int8)]),
                     "key": pa.nulls(2 * n, pa.large_string()),
                     "emb": pa.nulls(2 * n, pa.list_(pa.float32()))}, schema=_EV)


def _ev_keys_batch(t: pa.Table, packed) -> pa.Table:
    """The keys of the rows in a dropped pair (their bit set in ``packed``)."""
    t = t.filter(pa.array(_bit(t.column("gid").to_numpy(), packed)))
    n = t.num_rows
    return pa.table({"gid": t.column("gid"), "w": pa.array(np.full(n, -1, np.int64)),
                     "b": pa.array(np.full(n, -1, np.int64)),
                     "side": pa.array(np.full(n, _TEXT_SIDE, np.int8)),
                     "key": t.column("key"), "emb": pa.nulls(n, pa.list_(pa.float32()))},
                    schema=_EV)


def _ev_emb_batch(batch: dict, packed) -> pa.Table:
    """The embeddings (as read, float32) of the rows in a dropped pair."""
    m = _bit(batch["gid"], packed)
    emb = np.asarray(batch["emb"][m], dtype=np.float32)
    n = emb.shape[0]
    return pa.table({"gid": pa.array(batch["gid"][m].astype(np.int64)),
                     "w": pa.array(np.full(n, -1, np.int64)),
                     "b": pa.array(np.full(n, -1, np.int64)),
                     "side": pa.array(np.full(n, _EMB_SIDE, np.int8)),
                     "key": pa.nulls(n, pa.large_string()),
                     "emb": pa.array(list(emb), pa.list_(pa.float32()))}, schema=_EV)


def _ev_attach_group(t: pa.Table) -> pa.Table:
    """One row's key and embedding, copied onto each half of its pairs."""
    side = t.column("side").to_numpy()
    halves = np.flatnonzero(side >= 0)
    if not halves.size:
        return _EV.empty_table()
    key = t.column("key").take(pa.array(np.flatnonzero(side == _TEXT_SIDE)[:1]))
    emb = t.column("emb").take(pa.array(np.flatnonzero(side == _EMB_SIDE)[:1]))
    key = key[0].as_py() if len(key) else None
    emb = emb[0].as_py() if len(emb) else None
    m = halves.size
    return pa.table({"gid": t.column("gid").take(pa.array(halves)),
                     "w": t.column("w").take(pa.array(halves)),
                     "b": t.column("b").take(pa.array(halves)),
                     "side": t.column("side").take(pa.array(halves)),
                     "key": pa.array([key] * m, pa.large_string()),
                     "emb": pa.array([emb] * m, pa.list_(pa.float32()))}, schema=_EV)


def _ev_pair_group(t: pa.Table) -> pa.Table:
    """One dropped pair with both rows' key and embedding: the containment of the keys
    (:func:`dedup.pair_containment`) and the cosine (:func:`dedup.pair_cosine`)."""
    side = t.column("side").to_numpy()
    if not ((side == 0).any() and (side == 1).any()):
        return _EVIDENCE.empty_table()
    a, b = int(np.flatnonzero(side == 0)[0]), int(np.flatnonzero(side == 1)[0])
    keys, embs = t.column("key").to_pylist(), t.column("emb").to_pylist()
    cont = pair_containment(keys[a], keys[b]) if keys[a] is not None and keys[b] is not None \
        else float("nan")
    cos = pair_cosine(embs[a], embs[b]) if embs[a] is not None and embs[b] is not None \
        else float("nan")
    return pa.table({"w": pa.array([t.column("w")[0].as_py()], pa.int64()),
                     "b": pa.array([t.column("b")[0].as_py()], pa.int64()),
                     "containment": pa.array([cont], pa.float64()),
                     "cosine": pa.array([cos], pa.float64())}, schema=_EVIDENCE)


def _evidence(w: np.ndarray, b: np.ndarray, n: int, keyed, features, parts) -> dict:
    """{(w, b): (containment, cosine)} of each dropped pair: the pair's halves meet their
    rows' keys (``keyed``, or None without texts) and embeddings (``features``) by
    ``groupby(row)``, then each other by ``groupby(pair)``. Only the rows in a pair are
    shuffled."""
    import ray
    import ray.data

    if not w.size:
        return {}
    mask = np.zeros(n, dtype=bool)
    mask[w], mask[b] = True, True
    packed = _pack(mask)
    parts_ = [ray.data.from_arrow(_ev_halves(w, b)),
              features.map_batches(_ev_emb_batch, batch_format="numpy",
                                   fn_kwargs={"packed": packed})]
    if keyed is not None:
        parts_.append(keyed.map_batches(_ev_keys_batch, batch_format="pyarrow",
                                        fn_kwargs={"packed": packed}))
    ds = (parts_[0].union(*parts_[1:]).groupby("gid", num_partitions=parts)
          .map_groups(_ev_attach_group, batch_format="pyarrow")
          .groupby(["w", "b"], num_partitions=parts)
          .map_groups(_ev_pair_group, batch_format="pyarrow"))
    got = _collect(ds, ["w", "b", "containment", "cosine"])
    return {(int(a), int(c)): (float(x), float(y)) for a, c, x, y in zip(
        got["w"].tolist(), got["b"].tolist(), got["containment"].tolist(),
        got["cosine"].tolist())}


# ------------------------------------------------------------------ the pipeline
def _pack(dropped: np.ndarray):
    import ray

    return ray.put(np.packbits(dropped))


def _collect(ds, columns) -> dict:
    """The (small) result columns of ``ds`` in the driver, as numpy arrays."""
    parts = {c: [] for c in columns}
    for batch in ds.iter_batches(batch_format="numpy", batch_size=65_536):
        for c in columns:
            parts[c].append(np.asarray(batch[c]))
    return {c: (np.concatenate(v) if v else np.zeros(0)) for c, v in parts.items()}


def _kmeans_rows(unit, dup_of: np.ndarray, sample_rows: int, seed: int):
    """The rows of ``unit`` (the alive rows) that train the k-means: all of them up to
    ``sample_rows``, else the embedded path's sample (:func:`dedup.kmeans_sample` of the
    alive rows in global order), picked out by one bit per row."""
    alive = np.flatnonzero(dup_of < 0)
    pos = kmeans_sample(alive.size, sample_rows, seed)
    if pos is None:
        return unit.select_columns(["gid", "emb"])
    chosen = np.zeros(dup_of.size, dtype=bool)
    chosen[alive[pos]] = True
    return unit.map_batches(_sampled_batch, batch_format="numpy",
                            fn_kwargs={"packed": _pack(chosen)})


def deduplicate_ray(shards, *, exact: bool = True, fuzzy: bool = True, near: bool = True,
                    threshold: float = DEFAULT_THRESHOLD,
                    containment: float = DEFAULT_CONTAINMENT,
                    rows_per_cluster: int = ROWS_PER_CLUSTER, probes: int = 2,
                    boilerplate_min_docs: int | None = BOILERPLATE_MIN_DOCS, seed: int = 0,
                    kmeans_sample_rows: int = KMEANS_SAMPLE_ROWS,
                    max_cluster_rows: int = MAX_CLUSTER_ROWS, id_column: str = "id",
                    quality_column: str = "quality", embedding_column: str = "embedding",
                    expected_dim: int | None = None, shuffle_partitions: int | None = None,
                    near_containment: float = NEAR_MIN_CONTAINMENT,
                    fuzzy_min_shingles: int = FUZZY_MIN_SHINGLES, log=None) -> DedupResult:
    """:func:`dedup.deduplicate` on a Ray cluster (the one ``ray.init`` connected this process
    to; a local one is started when none is). ``shards``: :class:`ShardSource` per shard, in
    shard-index order. ``shuffle_partitions``: partitions of each groupby (None: Ray's
    default). Returns per-shard keep masks and the dropped rows with their lineage, equal to
    the embedded path's on the same rows."""
    if max_cluster_rows < 1 or kmeans_sample_rows < 1:
        raise ValueError(f"max_cluster_rows ({max_cluster_rows}) and kmeans_sample_rows "
                         f"({kmeans_sample_rows}) must be at least 1")
    try:
        return _deduplicate_ray(
            list(shards), exact=exact, fuzzy=fuzzy, near=near, threshold=threshold,
            containment=containment, rows_per_cluster=rows_per_cluster, probes=probes,
            boilerplate_min_docs=boilerplate_min_docs, seed=seed,
            kmeans_sample_rows=kmeans_sample_rows, max_cluster_rows=max_cluster_rows,
            cols=_Cols(id_column, quality_column, embedding_column), expected_dim=expected_dim,
            parts=shuffle_partitions, near_containment=near_containment,
            fuzzy_min_shingles=fuzzy_min_shingles, log=log or (lambda msg: None))
    except DataContractError:
        raise
    except Exception as exc:  # a Ray task's failure: its contract error, if it was one
        inner = _contract_error(exc)
        if inner is None:
            raise
        raise inner from exc


def _deduplicate_ray(shards, *, exact, fuzzy, near, threshold, containment, rows_per_cluster,
                     probes, boilerplate_min_docs, seed, kmeans_sample_rows, max_cluster_rows,
                     cols, expected_dim, parts, near_containment, fuzzy_min_shingles,
                     log) -> DedupResult:
    import ray
    import ray.data

    t0 = time.perf_counter()
    offsets, feat_items, text_items, language_sums = _plan(
        shards, cols, exact or fuzzy, texts_optional=near and near_containment > 0)
    n = int(offsets[-1])
    if not ray.is_initialized():
        ray.init()
    stats = {"rows": n, "threshold": threshold, "exact": exact, "fuzzy": fuzzy,
             "containment": containment, "near": near, "near_containment": near_containment,
             "fuzzy_min_shingles": fuzzy_min_shingles, "engine": "ray"}
    dup_of = np.full(n, -1, dtype=np.int64)
    reason = np.zeros(n, dtype=np.int8)
    cosine = np.full(n, np.nan)

    def items(rows):
        return ray.data.from_items(rows, override_num_blocks=max(1, len(rows)))

    keyed = None
    if text_items is not None:
        texts = items(text_items).map_batches(_read_texts, batch_size=1, batch_format="numpy",
                                              fn_kwargs={"cols": cols})
        common = set()
        if boilerplate_min_docs:
            counts = (texts.map_batches(_line_batch, batch_format="pyarrow")
                      .groupby("line", num_partitions=parts).count()
                      .map_batches(_common_batch, batch_format="pyarrow",
                                   fn_kwargs={"min_docs": int(boilerplate_min_docs)}))
            common = {str(x) for x in _collect(counts, ["line"])["line"].tolist()}
            stats["boilerplate_lines"] = len(common)
            log(f"dedup (ray): {len(common):,} boilerplate lines")
        keyed = texts.map_batches(_key_batch, batch_format="pyarrow",
                                  fn_kwargs={"common": ray.put(common)}).materialize()

    if exact and keyed is not None:
        got = _collect(keyed.map_batches(_hash_batch, batch_format="pyarrow")
                       .groupby("h", num_partitions=parts)
                       .map_groups(_exact_group, batch_format="numpy"), ["gid", "dup"])
        rows = got["gid"].astype(np.int64)
        dup_of[rows], reason[rows], cosine[rows] = got["dup"].astype(np.int64), _EXACT, 1.0
        stats["exact_dropped"] = int(rows.size)
        log(f"dedup (ray): {rows.size:,} exact duplicates")
    elif exact:
        stats["exact_skipped"] = "no text column"

    if fuzzy and keyed is not None:
        packed = _pack(dup_of >= 0)
        cand = (keyed.map_batches(_band_batch, batch_format="pyarrow",
                                  fn_kwargs={"packed": packed, "seed": seed,
                                             "min_shingles": int(fuzzy_min_shingles)})
                .groupby("bucket", num_partitions=parts)
                .map_groups(_band_group, batch_format="numpy"))
        halves = cand.map_batches(_halves_batch, batch_format="pyarrow")
        with_text = keyed.map_batches(_texts_batch, batch_format="pyarrow",
                                      fn_kwargs={"packed": packed})
        pairs = (halves.union(with_text).groupby("gid", num_partitions=parts)
                 .map_groups(_attach_group, batch_format="numpy")
                 .groupby(["w", "b"], num_partitions=parts)
                 .map_groups(_containment_group, batch_format="numpy",
                             fn_kwargs={"containment": containment}))
        got = _collect(pairs, ["w", "b", "c"])
        w, b, c = got["w"].astype(np.int64), got["b"].astype(np.int64), got["c"].astype(np.float64)
        # each row's partner with the highest containment (ties: the first in shard, row
        # order, as the embedded path)
        best = {}
        for o in np.lexsort((b, -c, w)):
            best.setdefault(int(w[o]), (int(b[o]), float(c[o])))
        for r, (o, cc) in best.items():
            dup_of[r], reason[r], cosine[r] = o, _FUZZY, np.nan
        stats["fuzzy_dropped"] = len(best)
        stats["fuzzy_pairs"] = int(w.size)
        log(f"dedup (ray): {len(best):,} fuzzy duplicates from {w.size:,} verified pairs")
    elif fuzzy:
        stats["fuzzy_skipped"] = "no text column"

    if near and n > 1:
        alive_n = int((dup_of < 0).sum())
        packed = _pack(dup_of >= 0)
        unit = (items(feat_items)
                .map_batches(_read_features, batch_size=1, batch_format="numpy",
                             fn_kwargs={"cols": cols, "dim": expected_dim,
                                        "language_sums": language_sums})
                .map_batches(_unit_batch, batch_format="numpy", fn_kwargs={"packed": packed})
                .materialize())
        k = max(1, int(round(alive_n / rows_per_cluster)))
        stats["clusters"] = k
        index_ref = None
        if k > 1:
            got = _collect(_kmeans_rows(unit, dup_of, kmeans_sample_rows, seed), ["gid", "emb"])
            xs = np.ascontiguousarray(got["emb"][np.argsort(got["gid"], kind="stable")],
                                      dtype=np.float32)
            stats["kmeans_sample"] = int(xs.shape[0])
            import faiss

            km = _train_kmeans(xs, k, seed)
            index_ref = ray.put(faiss.serialize_index(km.index))
            del xs, got
        hits = (unit.map_batches(_assign_batch, batch_format="numpy",
                                 fn_kwargs={"index_bytes": index_ref,
                                            "probes": min(probes, k)})
                .groupby("cluster", num_partitions=parts)
                .map_groups(_near_group, batch_format="numpy",
                            fn_kwargs={"threshold": float(threshold),
                                       "cap": int(max_cluster_rows)}))
        got = _collect(hits, ["gid", "dup", "cos", "cluster"])
        g, d = got["gid"].astype(np.int64), got["dup"].astype(np.int64)
        cs, cl = got["cos"].astype(np.float32), got["cluster"].astype(np.int64)
        # a row seen in 2 clusters keeps its highest cosine (ties: the lower cluster, which
        # the embedded path visits first)
        first = np.lexsort((cl, -cs.astype(np.float64), g))
        keep = np.r_[True, g[first][1:] != g[first][:-1]] if first.size else first.astype(bool)
        sel = first[keep]
        dup_of[g[sel]], reason[g[sel]], cosine[g[sel]] = d[sel], _NEAR, cs[sel]
        stats["near_dropped"] = int(sel.size)
        log(f"dedup (ray): {sel.size:,} near duplicates in {k:,} clusters")

    # the evidence of every dropped pair (containment and cosine), and the semantic stage's
    # text guard: a near pair whose texts do not overlap at near_containment stays
    drop = np.flatnonzero(dup_of >= 0)
    features = (items(feat_items)
                .map_batches(_read_features, batch_size=1, batch_format="numpy",
                             fn_kwargs={"cols": cols, "dim": expected_dim,
                                        "language_sums": language_sums}))
    ev = _evidence(drop, dup_of[drop], n, keyed, features, parts)
    if near and n > 1 and keyed is not None and near_containment > 0:
        veto = [i for i in np.flatnonzero(reason == _NEAR).tolist()
                if not ev[(i, int(dup_of[i]))][0] >= near_containment]
        dup_of[veto], reason[veto], cosine[veto] = -1, 0, np.nan
        stats["near_text_vetoed"] = len(veto)
        stats["near_dropped"] = int((reason == _NEAR).sum())
        log(f"dedup (ray): {len(veto):,} near duplicates kept by the text guard")

    drop = np.flatnonzero(dup_of >= 0)
    keep = dup_of < 0
    shard_of = np.searchsorted(offsets, np.arange(n), side="right") - 1 if n else np.zeros(0, int)

    def where(i):
        s = int(shard_of[i])
        return s, int(i - offsets[s])

    kept = kept_rows(dup_of)
    dropped = []
    for i in drop.tolist():
        (s, r), (ds_, dr), (ks, kr) = where(i), where(dup_of[i]), where(kept[i])
        why = str(_REASONS[reason[i]])
        cont, cos = ev[(i, int(dup_of[i]))]
        dropped.append({"shard": s, "row": r, "dup_of_shard": ds_, "dup_of_row": dr,
                        "kept_shard": ks, "kept_row": kr, "reason": why, "kind": KINDS[why],
                        "cosine": float(cosine[i]) if why == "near" else cos,
                        "containment": (1.0 if why == "exact" else cont) if keyed is not None
                        else float("nan")})
    masks = [keep[offsets[s]:offsets[s + 1]] for s in range(len(shards))]
    stats.update(dropped=int(drop.size), kept=int(keep.sum()),
                 dropped_fraction=float(drop.size / max(1, n)),
                 seconds=time.perf_counter() - t0)
    return DedupResult(keep=masks, dropped=dropped, stats=stats)
