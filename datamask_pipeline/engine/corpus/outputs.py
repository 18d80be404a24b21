"""The corpus selection's outputs on the data root.

* ``corpus/selection/<version>/<key>.parquet`` (each shard's selected rows: shard, raw file,
  row, id), written by the shard's own task through :class:`SelectionFiles` (the engine's
  ``select_corpus(sink=...)``), so the coordinator never holds the selected rows of the
  corpus; ``corpus/selection.json`` (the run's facts and the manifest naming the version),
  written last by :func:`write_selection`: that write publishes the new version, and older
  versions are removed after it (a failed run leaves the last published selection as it
  was). Read back by :func:`read_selection` (a small corpus, one table), :func:`selection_files`
  (each shard's file) and, for a warm start, :func:`last_selection`.
* ``selected/<key>.parquet`` (each shard's selected raw rows, every column unchanged) with
  ``corpus/subsets.json`` (each shard's digest, so only changed shards are rewritten):
  :func:`write_subsets`, one task per shard; the per-source counts of corpus and subsets:
  :func:`source_shares`, one task per shard.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .. import storage
from ..contract import ID
from ..data import DataContractError, raw_row_numbers
from .executor import InProcess

__all__ = ["SELECTION_FACTS", "SUBSETS", "SelectionFiles", "write_selection", "selection_files",
           "last_selection", "read_selection", "selection_facts", "selection_digest", "Subsets", "SubsetError",
           "write_subsets", "source_shares"]

SELECTION_FACTS = "selection.json"
LEGACY_SELECTION = "selection.parquet"  # one file of every row (before the per-shard files)
SUBSETS = "subsets.json"
DEDUP_FACTS_KEPT = ("enabled", "threshold", "containment", "dropped", "exact_dropped",
                    "fuzzy_dropped", "near_dropped", "rows")
SELECTION_SCHEMA = pa.schema([("partition_key", pa.string()), ("raw_uri", pa.string()),
                              ("row", pa.int64()), ("id", pa.string())])


@dataclass(frozen=True)
class SelectionFiles:
    """One version of the corpus selection: each shard's selected rows (the features' row
    numbers) to ``corpus/selection/<version>/<key>.parquet``, one row per selected row:
    partition_key, raw_uri, row (in the features: the raw file's row unless ingestion
    quarantined rows, see ``engine.data.raw_row_numbers``), id (as text). :meth:`write` runs
    in the task that holds the shard's rows. Picklable (three strings)."""

    root: str
    raw: str | None
    version: str

    @classmethod
    def new(cls, layout: storage.DataLayout) -> "SelectionFiles":
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
        return cls(layout.root, layout.raw, f"v{stamp}-{uuid.uuid4().hex[:8]}")

    @property
    def layout(self) -> storage.DataLayout:
        return storage.DataLayout(self.root, self.raw)

    @property
    def dir(self) -> str:
        return self.layout.corpus_selection_dir(self.version)

    def uri(self, key: str) -> str:
        return self.layout.corpus_selection_file(self.version, key)

    def write(self, key: str, rows) -> dict:
        """The shard's selected rows (its own numbering) with their ids, published atomically;
        returns {"rows", "digest"} (the digest of the row numbers)."""
        layout = self.layout
        rows = np.sort(np.asarray(rows, dtype=np.int64))
        ids = storage.read_table(layout.features(key), [ID]).column(ID).take(pa.array(rows))
        table = pa.table([pa.array([key] * rows.size, pa.string()),
                          pa.array([layout.raw_shard(key)] * rows.size, pa.string()),
                          pa.array(rows, pa.int64()), pc.cast(ids, pa.string())],
                         schema=SELECTION_SCHEMA)
        storage.makedirs(self.dir)
        storage.atomic_write_table(table, self.uri(key))
        return {"rows": int(rows.size), "digest": hashlib.sha256(rows.tobytes()).hexdigest()[:16]}


def selection_digest(files: dict) -> str:
    """One digest of a selection's per-shard digests (the asset's data version)."""
    blob = json.dumps({k: v["digest"] for k, v in sorted(files.items())}).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def write_selection(layout: storage.DataLayout, result, sink: SelectionFiles, shards: list,
                    excluded: dict, dedup: dict, config_hash: str) -> str:
    """Publish the version ``sink`` holds (its files written by ``select_corpus``'s tasks):
    ``corpus/selection.json`` (the result's summary, the manifest of the version's files, the
    shards left out and why, the dedup's facts, each shard's input rows and version, the
    knobs' hash), then remove every other version. Returns the json's uri."""
    if result.files is None or set(result.files) != {s.key for s in shards}:
        raise ValueError("write_selection: the selection's files were not written for every "
                         "shard (select_corpus(sink=...))")
    summary = result.summary()
    summary["files"] = {"version": sink.version, "digest": selection_digest(result.files),
                        "shards": result.files}
    summary["excluded"] = excluded
    summary["dedup"] = {k: dedup.get(k) for k in DEDUP_FACTS_KEPT}
    summary["sizes"] = {s.key: s.n for s in shards}  # input rows of each shard
    summary["versions"] = {s.key: s.version for s in shards}
    summary["config_hash"] = config_hash
    out = layout.corpus_file(SELECTION_FACTS)
    storage.atomic_write_bytes(out, json.dumps(summary, indent=1, default=float).encode())
    for old in storage.list_dirs(layout.corpus_selection_dir()):
        if old.rstrip("/").rsplit("/", 1)[-1] != sink.version:
            storage.remove(old, recursive=True)
    storage.remove(layout.corpus_file(LEGACY_SELECTION))
    return out


def selection_facts(layout: storage.DataLayout) -> dict | None:
    """``corpus/selection.json`` of the published selection; None when none was published."""
    uri = layout.corpus_file(SELECTION_FACTS)
    if not storage.exists(uri):
        return None
    facts = json.loads(storage.read_bytes(uri))
    return facts if "files" in facts else None  # a selection from before the per-shard files


def selection_files(layout: storage.DataLayout, facts: dict | None = None) -> dict:
    """{shard: its selected rows' file} of the published selection ({} when none)."""
    facts = facts if facts is not None else selection_facts(layout)
    if not facts:
        return {}
    version = facts["files"]["version"]
    return {key: layout.corpus_selection_file(version, key)
            for key in sorted(facts["files"]["shards"])}


def last_selection(layout: storage.DataLayout, shards: list, config_hash: str,
                   budget) -> dict | None:
    """{shard: its file of the last corpus selection} for the shards whose features are
    unchanged since, when it was made with the same knobs and budget; None otherwise. The
    rows are read by each shard's own task (``select_corpus``'s ``warm_start``)."""
    facts = selection_facts(layout)
    if (facts is None or facts.get("config_hash") != config_hash
            or facts.get("budget") != {"kind": budget.kind, "value": budget.value}):
        return None
    versions = facts.get("versions", {})
    files = selection_files(layout, facts)
    return {s.key: files[s.key] for s in shards
            if s.key in files and versions.get(s.key) == s.version}


def read_selection(layout: storage.DataLayout) -> tuple[pa.Table, dict] | None:
    """(every selected row as one table, the facts), or None when no selection was published.
    One table of the whole selection: for a corpus whose selection fits this process (the
    files of :func:`selection_files` are the way past that)."""
    facts = selection_facts(layout)
    if facts is None:
        return None
    tables = [storage.read_table(uri) for uri in selection_files(layout, facts).values()]
    return (pa.concat_tables(tables) if tables else SELECTION_SCHEMA.empty_table()), facts


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


def subset_task(shared, key: str, sel_uri: str, old_digest: str | None) -> dict:
    """One shard's ``selected/<key>.parquet`` from its selection file (run as the shard's own
    task): rewritten unless its digest (the raw rows and the raw file's size and mtime) is
    ``old_digest`` and the file exists. Returns {"digest", "rows" written, "rewritten"}."""
    layout, id_column = shared
    rows = storage.read_table(sel_uri, ["row"]).column("row").to_numpy()
    # the selection's rows are the features' rows: the raw file's rows differ once
    # ingestion quarantined some (the digest is of the raw rows, so a change of what was
    # quarantined rewrites the subset)
    rows = raw_row_numbers(layout.features(key), rows)
    raw_uri = layout.raw_shard(key)
    fs_r, p_r = storage.resolve(raw_uri)
    info = fs_r.get_file_info(p_r)
    digest = _shard_digest(rows, f"{info.size}:{info.mtime_ns}")
    out = layout.corpus_selected(key)
    if old_digest == digest and storage.exists(out):
        return {"digest": digest, "rows": 0, "rewritten": False}
    try:
        raw_ids = _raw_ids_at(raw_uri, id_column, rows)
        w = storage.write_selected_rows(raw_uri, out, raw_ids, id_column)
    except (DataContractError, storage.StorageError) as exc:
        raise SubsetError(key, f"shard {key!r}: cannot write the selected rows: "
                               f"{exc}") from exc
    if w["rows"] != rows.size:  # pragma: no cover - write_selected_rows checks every id
        raise SubsetError(key, f"shard {key!r}: wrote {w['rows']} rows, {rows.size} selected")
    return {"digest": digest, "rows": int(w["rows"]), "rewritten": True}


def write_subsets(layout: storage.DataLayout, id_column: str, executor=None,
                  log: Callable[[str], None] | None = None) -> Subsets:
    """Each shard's selected raw rows (the published selection's files) to
    ``selected/<key>.parquet``, one task per shard on ``executor`` (default: this process),
    rewriting only the shards whose selection or raw file changed since
    ``corpus/subsets.json``, and removing the files of shards not in the selection;
    :class:`SubsetError` when a shard's rows cannot be written."""
    files = selection_files(layout)
    man_uri = layout.corpus_file(SUBSETS)
    manifest = json.loads(storage.read_bytes(man_uri)) if storage.exists(man_uri) else {}
    keys = sorted(files)
    plain = storage.DataLayout(layout.root, layout.raw)
    res = (executor or InProcess()).map(subset_task, [(k, files[k], manifest.get(k))
                                                      for k in keys], shared=(plain, id_column))
    done, new_manifest = Subsets(keys=keys), {}
    for key, r in zip(keys, res):
        new_manifest[key] = r["digest"]
        if r["rewritten"]:
            done.rewritten.append(key)
            done.rows_written += r["rows"]
            if log is not None:
                log(f"corpus_subset: {key}: {r['rows']:,} rows -> {layout.corpus_selected(key)}")
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


def source_task(shared, key: str):
    """({source: rows} of the shard's raw file, {source: rows} of its subset) or None when the
    raw file has no such column (the shard's own task)."""
    layout, column = shared
    raw = _counts(layout.raw_shard(key), column)
    sel_uri = layout.corpus_selected(key)
    sel = _counts(sel_uri, column) if storage.exists(sel_uri) else {}
    return None if raw is None or sel is None else (raw, sel)


def source_shares(layout: storage.DataLayout, keys, column: str = "source",
                  executor=None) -> dict | None:
    """{source: (rows in the corpus, rows selected)}, one task per shard on ``executor``;
    None when a shard has no such column."""
    plain = storage.DataLayout(layout.root, layout.raw)
    out: dict = {}
    for got in (executor or InProcess()).map(source_task, [(k,) for k in keys],
                                             shared=(plain, column)):
        if got is None:
            return None
        raw, sel = got
        for name, c in raw.items():
            r, s_ = out.get(name, (0, 0))
            out[name] = (r + c, s_ + sel.get(name, 0))
    return out or None
