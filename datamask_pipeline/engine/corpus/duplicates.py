"""The corpus dedup over the data root's shards, and its record.

:func:`dedup_local` (this process) or :func:`dedup_on_ray` (Ray Data) runs the dedup over the
shards' files; :func:`write_duplicates` writes ``corpus/duplicates.parquet`` (each dropped row,
the row it duplicates, the row kept for it, the kind and the evidence) and ``corpus/dedup.json``
(the facts, the knobs, each shard's version); :func:`dedup_keep` reads them back as the keep
masks the selection honours. ``knobs``: the dedup's settings as ``corpus_dedup``'s config
names them (enabled, exact, fuzzy, containment, near, threshold, near_containment,
rows_per_cluster, ray_partitions).
"""

from __future__ import annotations

import functools
import json
from typing import Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import storage
from ..config import ConfigError
from ..contract import EMBEDDING, ID, QUALITY
from ..data import raw_row_numbers
from ..id_column import file_columns

__all__ = ["DUPLICATES", "DEDUP_FACTS", "DUPLICATES_SCHEMA", "dedup_local", "dedup_on_ray",
           "lineage_ids", "write_duplicates", "read_facts", "dedup_keep", "keep_mask",
           "duplicate_sample"]

DUPLICATES = "duplicates.parquet"
DEDUP_FACTS = "dedup.json"
DUPLICATES_SCHEMA = pa.schema([
    ("partition_key", pa.string()), ("row", pa.int64()), ("id", pa.string()),
    ("dup_of_partition_key", pa.string()), ("dup_of_row", pa.int64()),
    ("dup_of_id", pa.string()), ("kept_partition_key", pa.string()), ("kept_row", pa.int64()),
    ("kept_id", pa.string()), ("reason", pa.string()), ("kind", pa.string()),
    ("cosine", pa.float64()), ("containment", pa.float64())])
PAIRS_PER_KIND = 4


def _needs_texts(knobs: Mapping) -> bool:
    return bool(knobs["exact"] or knobs["fuzzy"]
                or (knobs["near"] and knobs["near_containment"] > 0))


def _algorithm(knobs: Mapping) -> dict:
    return {k: knobs[k] for k in ("exact", "fuzzy", "containment", "near", "threshold",
                                  "rows_per_cluster", "near_containment")}


def raw_texts(raw_uri: str, column: str | None, features_uri: str | None = None):
    """The raw text column, at the features' rows (their raw row numbers when ingestion
    quarantined rows: ``engine.data.raw_row_numbers``)."""
    col = storage.read_column(raw_uri, column) if column else None
    if col is None:
        return None
    rows = raw_row_numbers(features_uri) if features_uri is not None else None
    col = col.combine_chunks()
    return col if rows is None else col.take(pa.array(rows))


def dedup_local(layout: storage.DataLayout, shards: list, knobs: Mapping,
                text_column: str | None) -> tuple:
    """``deduplicate`` in this process, every shard's rows in memory (the texts only when
    every raw file has the text column). Returns (the result, each shard's ids as text)."""
    from .dedup import deduplicate

    parts = [s.load() for s in shards]
    # ids as text (shards may differ in id type): dedup's tie-break and the lineage
    ids_txt = [pc.cast(pa.array(p.ids), pa.string()).to_numpy(zero_copy_only=False)
               for p in parts]
    texts = None
    if _needs_texts(knobs):
        got = [raw_texts(layout.raw_shard(s.key), text_column, layout.features(s.key))
               for s in shards]
        if all(t is not None for t in got):
            texts = pa.chunked_array(got).combine_chunks() if len(got) > 1 else got[0]
    res = deduplicate(
        np.concatenate([p.embeddings for p in parts]),
        np.concatenate([np.asarray(p.quality, dtype=np.float64) for p in parts]),
        np.concatenate(ids_txt),
        np.concatenate([np.full(p.n, i) for i, p in enumerate(parts)]),
        np.concatenate([np.arange(p.n) for p in parts]), texts, **_algorithm(knobs))
    return res, ids_txt


def dedup_on_ray(layout: storage.DataLayout, shards: list, knobs: Mapping, *,
                 text_column: str | None, expected_dim=None, log=None):
    """``deduplicate_ray`` on the Ray cluster this process is connected to: the shards'
    files are read by Ray tasks (the texts only when every raw file has the text column, as
    :func:`dedup_local`)."""
    from .dedup_ray import ShardSource, deduplicate_ray

    column = text_column or None
    texts = bool(column) and _needs_texts(knobs) and all(
        column in file_columns(layout.raw_shard(s.key)) for s in shards)
    sources = [ShardSource(features=layout.features(s.key),
                           raw=layout.raw_shard(s.key) if texts else None,
                           text_column=column if texts else None) for s in shards]
    return deduplicate_ray(sources, **_algorithm(knobs), id_column=ID, quality_column=QUALITY,
                           embedding_column=EMBEDDING, expected_dim=expected_dim,
                           shuffle_partitions=knobs["ray_partitions"], log=log)


def lineage_ids(res, shards: list, layout: storage.DataLayout) -> dict:
    """{shard index: {row: id as text}} of the rows the dropped rows name (their ids only,
    one shard's id column at a time)."""
    want = {}
    for d in res.dropped:
        want.setdefault(d["shard"], set()).add(d["row"])
        want.setdefault(d["dup_of_shard"], set()).add(d["dup_of_row"])
        want.setdefault(d["kept_shard"], set()).add(d["kept_row"])
    out = {}
    for i, rows in want.items():
        rows = sorted(rows)
        col = storage.read_table(layout.features(shards[i].key), [ID]).column(ID)
        got = pc.cast(col.take(pa.array(rows)), pa.string()).to_pylist()
        out[i] = dict(zip(rows, got))
    return out


def write_duplicates(layout: storage.DataLayout, shards: list, excluded: dict, knobs: Mapping,
                     engine: str, res=None, ids_txt=None,
                     recomputed_by: str | None = None) -> tuple:
    """The dedup's record: ``res`` (None: dedup off or no shard) written to
    ``corpus/duplicates.parquet`` (ids from ``ids_txt``, each shard's ids by row) and
    ``corpus/dedup.json``. Returns (the table, the facts, the parquet's uri)."""
    stats = {"enabled": knobs["enabled"], "threshold": knobs["threshold"], "rows": 0,
             "dropped": 0, "engine": engine}
    cols = {f.name: [] for f in DUPLICATES_SCHEMA}
    if res is not None:
        for d in res.dropped:
            for pre, (sh, row) in (("", (d["shard"], d["row"])),
                                   ("dup_of_", (d["dup_of_shard"], d["dup_of_row"])),
                                   ("kept_", (d["kept_shard"], d["kept_row"]))):
                cols[pre + "partition_key"].append(shards[sh].key)
                cols[pre + "row"].append(row)
                cols[pre + "id"].append(ids_txt[sh][row])
            for c in ("reason", "kind", "cosine", "containment"):
                cols[c].append(d[c])
        stats.update(res.stats)
    table = pa.table({f.name: pa.array(cols[f.name], f.type) for f in DUPLICATES_SCHEMA},
                     schema=DUPLICATES_SCHEMA)
    storage.makedirs(layout.corpus_dir())
    out = layout.corpus_file(DUPLICATES)
    storage.atomic_write_table(table, out)
    stats.update(versions={s.key: s.version for s in shards}, excluded=excluded,
                 config=dict(knobs))
    if recomputed_by:
        stats["recomputed_by"] = recomputed_by
    storage.atomic_write_bytes(layout.corpus_file(DEDUP_FACTS),
                               json.dumps(stats, indent=1, default=float).encode())
    return table, stats, out


def read_facts(layout: storage.DataLayout) -> dict:
    """The last dedup's facts (``corpus/dedup.json``)."""
    return json.loads(storage.read_bytes(layout.corpus_file(DEDUP_FACTS)))


def dedup_keep(layout: storage.DataLayout, shards: list, recompute=None) -> tuple:
    """Each shard's keep mask from ``corpus/duplicates.parquet`` (None where no row is
    dropped), and the dedup facts. The keep decisions hold only for the shards the dedup saw:
    when a shard it saw is gone (its kept rows may have been the reason others were dropped)
    or one is new or re-ingested, ``recompute(stale, gone)`` runs the dedup again over the
    shards present and returns its facts; without ``recompute`` that fails."""
    out = layout.corpus_file(DUPLICATES)
    if not storage.exists(out) or not storage.exists(layout.corpus_file(DEDUP_FACTS)):
        raise ConfigError("no corpus/duplicates.parquet: materialize corpus_dedup first "
                          "(corpus_job runs it; its config enabled=false turns it off)")
    facts = read_facts(layout)
    if facts.get("enabled", True):
        seen = facts.get("versions", {})
        stale = [s.key for s in shards if seen.get(s.key) != s.version]
        gone = sorted(set(seen) - {s.key for s in shards})
        if stale or gone:
            if recompute is None:
                raise ConfigError(f"corpus_dedup ran before shard(s) {stale[:5]} were "
                                  f"(re)ingested or over shard(s) {gone[:5]} that are gone: "
                                  "materialize corpus_dedup again (corpus_job runs both)")
            facts = recompute(stale, gone)
    counts = pc.value_counts(storage.read_table(out, ["partition_key"]).column("partition_key"))
    dropped = {c["values"]: int(c["counts"]) for c in counts.to_pylist()}
    for s in shards:
        if dropped.get(s.key):
            # the mask is read by the shard's own task, not held here for every shard
            s.keep = functools.partial(keep_mask, out, s.key, s.n)
            s.n_kept = s.n - dropped[s.key]
    return shards, facts


def keep_mask(duplicates_uri: str, key: str, n: int) -> np.ndarray:
    """Shard ``key``'s keep mask: its rows not named in ``duplicates.parquet``."""
    import pyarrow.dataset as ds

    fs, path = storage.resolve(duplicates_uri)
    t = ds.dataset(path, filesystem=fs, format="parquet").to_table(
        columns=["row"], filter=ds.field("partition_key") == key)
    keep = np.ones(n, dtype=bool)
    keep[t.column("row").to_numpy()] = False
    return keep


def duplicate_sample(layout: storage.DataLayout, text_column: str | None, keys: set,
                     per_kind: int = PAIRS_PER_KIND, seed: int = 0) -> list:
    """A seeded sample of ``corpus/duplicates.parquet`` (up to ``per_kind`` dropped rows of
    each kind, whose shards are all in ``keys``) with both texts, for the report's side-by-side
    table; [] without a duplicates file or a text column."""
    uri = layout.corpus_file(DUPLICATES)
    column = text_column or None
    if not column or not storage.exists(uri):
        return []
    t = storage.read_table(uri)
    if "kind" not in t.column_names or not t.num_rows:
        return []
    rows = [d for d in t.to_pylist() if d["partition_key"] in keys
            and d["dup_of_partition_key"] in keys]
    rng = np.random.default_rng(seed)
    picked = []
    for kind in ("exact", "fuzzy", "semantic"):
        of = [d for d in rows if d["kind"] == kind]
        picked += [of[i] for i in sorted(rng.choice(len(of), min(per_kind, len(of)),
                                                    replace=False))] if of else []
    want = {}
    for d in picked:
        want.setdefault(d["partition_key"], set()).add(d["row"])
        want.setdefault(d["dup_of_partition_key"], set()).add(d["dup_of_row"])
    texts = {}
    for key, rs in want.items():
        rs = sorted(rs)
        col = storage.read_column(layout.raw_shard(key), column)
        if col is None:
            return []
        raw = raw_row_numbers(layout.features(key), np.asarray(rs, dtype=np.int64))
        got = col.take(pa.array(np.asarray(raw, dtype=np.int64))).to_pylist()
        texts.update({(key, r): v for r, v in zip(rs, got)})
    return [{"kind": d["kind"], "containment": d["containment"], "cosine": d["cosine"],
             "dropped": f"{d['partition_key']} row {d['row']} (id {d['id']})",
             "kept": f"{d['dup_of_partition_key']} row {d['dup_of_row']} (id {d['dup_of_id']})",
             "dropped_text": texts[(d["partition_key"], d["row"])],
             "kept_text": texts[(d["dup_of_partition_key"], d["dup_of_row"])]} for d in picked]
