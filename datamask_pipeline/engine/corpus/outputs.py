"""The corpus selection's outputs on the data root.

* ``corpus/selection.parquet`` (one row per selected row: shard, raw file, row, id) and
  ``corpus/selection.json`` (the run's facts): :func:`write_selection`; read back for a warm
  start by :func:`last_selection`.
* ``selected/<key>.parquet`` (each shard's selected raw rows, every column unchanged) with
  ``corpus/subsets.json`` (each shard's digest, so only changed shards are rewritten):
  :func:`write_subsets`; the per-source counts of corpus and subsets: :func:`source_shares`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import storage
from ..contract import ID
from ..data import DataContractError, raw_row_numbers

__all__ = ["SELECTION", "SELECTION_FACTS", "SUBSETS", "selection_table", "write_selection",
           "last_selection", "read_selection", "Subsets", "SubsetError", "write_subsets", "source_shares"]

SELECTION = "selection.parquet"
SELECTION_FACTS = "selection.json"
SUBSETS = "subsets.json"
DEDUP_FACTS_KEPT = ("enabled", "threshold", "containment", "dropped", "exact_dropped",
                    "fuzzy_dropped", "near_dropped", "rows")


def selection_table(result, shards: list, layout: storage.DataLayout) -> pa.Table:
    """One row per selected row: partition_key, raw_uri, row (in the features: the raw
    file's row unless ingestion quarantined rows, see ``engine.data.raw_row_numbers``), id (as
    text)."""
    cols = {"partition_key": [], "raw_uri": [], "row": [], "id": []}
    for s in shards:
        rows = result.selected[s.key]
        if not rows.size:
            continue
        ids = storage.read_table(layout.features(s.key), [ID]).column(ID).take(pa.array(rows))
        cols["partition_key"] += [s.key] * rows.size
        cols["raw_uri"] += [layout.raw_shard(s.key)] * rows.size
        cols["row"].append(rows.astype(np.int64))
        cols["id"].append(pc.cast(ids, pa.string()).to_numpy(zero_copy_only=False))
    return pa.table({
        "partition_key": pa.array(cols["partition_key"], pa.string()),
        "raw_uri": pa.array(cols["raw_uri"], pa.string()),
        "row": pa.array(np.concatenate(cols["row"]) if cols["row"] else [], pa.int64()),
        "id": pa.array(np.concatenate(cols["id"]) if cols["id"] else [], pa.string()),
    })


def write_selection(layout: storage.DataLayout, result, shards: list, excluded: dict,
                    dedup: dict, config_hash: str) -> str:
    """``corpus/selection.parquet`` and ``corpus/selection.json`` (the result's summary, the
    shards left out and why, the dedup's facts, each shard's input rows and version, the
    knobs' hash). Returns the parquet's uri."""
    table = selection_table(result, shards, layout)
    out = layout.corpus_file(SELECTION)
    storage.makedirs(layout.corpus_dir())
    storage.atomic_write_table(table, out)
    summary = result.summary()
    summary["excluded"] = excluded
    summary["dedup"] = {k: dedup.get(k) for k in DEDUP_FACTS_KEPT}
    summary["sizes"] = {s.key: s.n for s in shards}  # input rows of each shard
    summary["versions"] = {s.key: s.version for s in shards}
    summary["config_hash"] = config_hash
    storage.atomic_write_bytes(layout.corpus_file(SELECTION_FACTS),
                               json.dumps(summary, indent=1, default=float).encode())
    return out


def last_selection(layout: storage.DataLayout, shards: list, config_hash: str,
                   budget) -> dict | None:
    """{shard: selected rows} of the last corpus selection, for the shards whose features are
    unchanged since, when it was made with the same knobs and budget; None otherwise."""
    facts_uri, sel_uri = layout.corpus_file(SELECTION_FACTS), layout.corpus_file(SELECTION)
    if not (storage.exists(facts_uri) and storage.exists(sel_uri)):
        return None
    facts = json.loads(storage.read_bytes(facts_uri))
    if (facts.get("config_hash") != config_hash
            or facts.get("budget") != {"kind": budget.kind, "value": budget.value}):
        return None
    versions = facts.get("versions", {})
    same = {s.key for s in shards if versions.get(s.key) == s.version}
    t = storage.read_table(sel_uri, ["partition_key", "row"])
    keys = t.column("partition_key").to_numpy(zero_copy_only=False)
    rows = t.column("row").to_numpy()
    return {k: rows[keys == k] for k in same}


def read_selection(layout: storage.DataLayout) -> tuple[pa.Table, dict] | None:
    """(``corpus/selection.parquet``, its facts), or None when no selection was published."""
    sel_uri = layout.corpus_file(SELECTION)
    if not storage.exists(sel_uri):
        return None
    return (storage.read_table(sel_uri),
            json.loads(storage.read_bytes(layout.corpus_file(SELECTION_FACTS))))


def _shard_digest(rows: np.ndarray, raw_sig: str) -> str:
    return hashlib.sha256(np.asarray(rows, dtype=np.int64).tobytes() + raw_sig.encode()).hexdigest()[:16]


def _raw_ids_at(raw_uri: str, id_column: str, rows: np.ndarray):
    """The raw ids at the given raw row numbers."""
    col = storage.read_table(raw_uri, [id_column]).column(id_column)
    return col.take(pa.array(np.asarray(rows, dtype=np.int64))).to_pylist()


class SubsetError(Exception):
    """A shard's selected rows cannot be written (``key``: the shard; the cause chained)."""

    def __init__(self, key: str, message: str):
        super().__init__(message)
        self.key = key


@dataclass
class Subsets:
    """What :func:`write_subsets` did: the shards rewritten, the files removed (shards that
    left the corpus), the rows written."""

    keys: list
    rewritten: list = field(default_factory=list)
    removed: list = field(default_factory=list)
    rows_written: int = 0


def write_subsets(layout: storage.DataLayout, table: pa.Table, keys: list, id_column: str,
                  log: Callable[[str], None] | None = None) -> Subsets:
    """Each shard's selected raw rows (``table``: the selection) to ``selected/<key>.parquet``,
    rewriting only the shards whose selection or raw file changed since ``corpus/subsets.json``,
    and removing the files of shards not in ``keys``; :class:`SubsetError` when a shard's
    rows cannot be written."""
    man_uri = layout.corpus_file(SUBSETS)
    manifest = json.loads(storage.read_bytes(man_uri)) if storage.exists(man_uri) else {}
    part = table.column("partition_key").to_numpy(zero_copy_only=False)
    done, new_manifest = Subsets(keys=keys), {}
    for key in keys:
        m = part == key
        ids = table.column("id").filter(pa.array(m)).to_pylist()
        rows = table.column("row").filter(pa.array(m)).to_numpy()
        # the selection's rows are the features' rows: the raw file's rows differ once
        # ingestion quarantined some (the digest is of the raw rows, so a change of what was
        # quarantined rewrites the subset)
        rows = raw_row_numbers(layout.features(key), rows)
        raw_uri = layout.raw_shard(key)
        fs_r, p_r = storage.resolve(raw_uri)
        info = fs_r.get_file_info(p_r)
        digest = _shard_digest(rows, f"{info.size}:{info.mtime_ns}")
        out = layout.corpus_selected(key)
        new_manifest[key] = digest
        if manifest.get(key) == digest and storage.exists(out):
            continue
        try:
            raw_ids = _raw_ids_at(raw_uri, id_column, rows)
            w = storage.write_selected_rows(raw_uri, out, raw_ids, id_column)
        except (DataContractError, storage.StorageError) as exc:
            raise SubsetError(key, f"shard {key!r}: cannot write the selected rows: "
                                   f"{exc}") from exc
        if w["rows"] != len(ids):  # pragma: no cover - write_selected_rows checks every id
            raise SubsetError(key, f"shard {key!r}: wrote {w['rows']} rows, "
                                   f"{len(ids)} selected")
        done.rewritten.append(key)
        done.rows_written += w["rows"]
        if log is not None:
            log(f"corpus_subset: {key}: {w['rows']:,} rows -> {out}")
    if storage.exists(layout.corpus_selected_root):
        for uri in storage.list_files(layout.corpus_selected_root, suffix=".parquet"):
            key = storage.partition_key_for(uri)
            if key not in new_manifest:
                storage.remove(uri)
                done.removed.append(key)
    storage.atomic_write_bytes(man_uri, json.dumps(new_manifest, indent=1, sort_keys=True).encode())
    return done


def _counts(uri: str, column: str):
    col = storage.read_column(uri, column)
    if col is None:
        return None
    return {item["values"]: item["counts"] for item in pc.value_counts(col).to_pylist()}


def source_shares(layout: storage.DataLayout, keys, column: str = "source") -> dict | None:
    """{source: (rows in the corpus, rows selected)}; None when a shard has no such column."""
    out: dict = {}
    for key in keys:
        raw = _counts(layout.raw_shard(key), column)
        sel_uri = layout.corpus_selected(key)
        sel = _counts(sel_uri, column) if storage.exists(sel_uri) else {}
        if raw is None or sel is None:
            return None
        for name, c in raw.items():
            r, s_ = out.get(name, (0, 0))
            out[name] = (r + c, s_ + sel.get(name, 0))
    return out or None
