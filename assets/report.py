"""The corpus summary: one DuckDB catalog over every selected shard.

This unpartitioned asset is the only writer of the catalog, the database of the ``catalog``
resource (a ``DuckDBResource``; by default ``<data root>/catalog.duckdb``). The catalog is
rebuilt from scratch in a temporary database beside it, through a ``DuckDBResource`` with the
``catalog`` resource's connection config, and renamed into place; for an object-store data root
the database is built in a local temporary directory and uploaded atomically. Why not one
transaction in the catalog file itself: DuckDB locks a file against other processes while a
writer has it open, so readers would get lock errors during a rebuild (and an open reader would
block it); after a rename, open readers keep the old file and new ones see the new one. A
rebuild that fails leaves the old catalog as it was. Per-partition steps never touch the
catalog, so parallel partitions never contend for a DuckDB lock.

Catalog contents:

* ``shards``: one row per registered shard with a selected subset: partition key, file URIs,
  rows before and after selection, kept fraction, mean quality before and after, the solver
  configured and the route that produced the selection (``route``; ``guard`` when a reference
  selection was returned instead), the whole-shard objective of that selection
  (``f_selection``, ``f_qua_selection``, ``f_div_selection``), of quality top-k and of random
  (the selection record in the mask file's metadata), spectrum flatness and the page of the
  shard report (when built);
* ``catalog_info``: when and from where the catalog was built, and which registered shards
  have no selection yet;
* ``selected_rows`` (local data roots): a view over all selected parquet files, every raw
  column plus ``partition_key``.

Where the numbers come from: the latest materializations of ``selected_subset``, ``mask`` and
``shard_report`` per partition (a few batched event-log queries, whatever the number of shards)
and one listing of the selected files (their sizes). No shard's file is opened when its
records are complete and agree: the selected file's size is the one ``selected_subset``
recorded, and the latest ``selected_subset`` is newer than the latest ``mask`` (the dry run's
rule).
A shard whose records are missing (an instance that did not build it), older than the metadata
the catalog needs, or disagree with the files is read from its files as before (features and
mask joined in DuckDB, the selected file's footer, the mask file's record, the shard report's
``report_metrics.json``), which fails naming the partition when they disagree; the
materialization's ``shards_read_from_files`` says how many were.
"""

import contextlib
import json
import math
import os
import shutil
import tempfile
import time
import uuid

import dagster as dg
from dagster_duckdb import DuckDBResource

from datamask_pipeline.engine import storage
from datamask_pipeline.engine.storage import mask_file
from datamask_pipeline.reporting.numerics import selection_label
from resources.storage import DataRoot

from .ingest import FRESHNESS, ID, OWNERS, QUALITY, retry_transient_io, stage
from .learn import mask
from .partitions import PARTITIONS_NAME
from .select import selected_subset
from .shard_report import shard_report

CODE_VERSION = "catalog-3"
GROUP = "corpus"

SHARD_COLUMNS = [
    ("partition_key", "VARCHAR"), ("raw_uri", "VARCHAR"), ("selected_uri", "VARCHAR"),
    ("rows_raw", "BIGINT"), ("rows_selected", "BIGINT"), ("kept_fraction", "DOUBLE"),
    ("quality_mean_before", "DOUBLE"), ("quality_mean_after", "DOUBLE"),
    ("selected_bytes", "BIGINT"), ("algorithm", "VARCHAR"), ("lamb", "DOUBLE"),
    ("solver", "VARCHAR"), ("route", "VARCHAR"), ("guard", "VARCHAR"),
    ("f_selection", "DOUBLE"), ("f_quality_topk", "DOUBLE"), ("f_random", "DOUBLE"),
    ("f_qua_selection", "DOUBLE"), ("f_div_selection", "DOUBLE"),
    ("spectrum_flatness_selected", "DOUBLE"), ("report_uri", "VARCHAR"),
]


def q(name: str) -> str:
    return '"' + str(name).replace('"', '""') + '"'


def sql_string(value: str) -> str:
    """A SQL string literal (DDL such as CREATE VIEW cannot take parameters)."""
    return "'" + str(value).replace("'", "''") + "'"


def _read_json(uri: str):
    if not storage.exists(uri):
        return None
    fs, path = storage.resolve(uri)
    with fs.open_input_stream(path) as fh:
        return json.loads(fh.read().decode())


def report_metrics(data_root: DataRoot, key: str):
    """The shard report's metrics (``report_metrics.json``), or None when none was built."""
    return _read_json(storage.join(data_root.report_dir(key), "report_metrics.json"))


def mask_scores(data_root: DataRoot, key: str) -> dict:
    """The objective numbers of the partition's selection and the route that produced it,
    from the mask file's record (the record names the selection ``datamask``; the catalog
    names it by its route)."""
    try:
        rec = mask_file.read_record(data_root.mask(key))
    except mask_file.MaskFileError as exc:
        raise dg.Failure(description=f"partition {key!r}: {exc}", allow_retries=False) from exc
    return {"algorithm": rec.term, "lamb": rec.lamb, "solver": rec.solver, "route": rec.route,
            "guard": rec.guard, "f_selection": rec.f("datamask"),
            "f_quality_topk": rec.f("quality_topk"), "f_random": rec.f("random"),
            "f_qua_selection": float(rec.scores["datamask"]["f_qua"]),
            "f_div_selection": float(rec.scores["datamask"]["f_div"])}


def shard_row(con, data_root: DataRoot, key: str) -> tuple[dict, dict | None]:
    """One shard's catalog row read from its files, and its shard report's metrics (None when
    no report was built): counts and quality from DuckDB over the features and mask parquet,
    objective numbers from the mask's selection record, spectrum flatness from the shard
    report."""
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    views = {}
    for name, uri in (("f", data_root.features(key)), ("m", data_root.mask(key))):
        fs, path = storage.resolve(uri)
        views[name] = f"{name}_{uuid.uuid4().hex}"
        con.register(views[name], ds.dataset(path, filesystem=fs, format="parquet"))
    try:
        rows_raw, rows_sel, q_before, q_after = con.execute(
            f"SELECT count(*), count(*) FILTER (WHERE m.{q('selected')}), avg(f.{q(QUALITY)}), "
            f"avg(f.{q(QUALITY)}) FILTER (WHERE m.{q('selected')}) "
            f"FROM {q(views['f'])} AS f JOIN {q(views['m'])} AS m ON f.{q(ID)} = m.{q(ID)}"
        ).fetchall()[0]
    finally:
        for v in views.values():
            con.unregister(v)
    sel_uri = data_root.selected(key)
    fs, path = storage.resolve(sel_uri)
    with fs.open_input_file(path) as fh:
        rows_file = pq.ParquetFile(fh).metadata.num_rows
    if rows_file != rows_sel:
        raise dg.Failure(
            description=f"partition {key!r}: {sel_uri} holds {rows_file} rows but the mask selects "
                        f"{rows_sel}: re-materialize selected_subset for this partition",
            allow_retries=False)
    metrics = report_metrics(data_root, key) or {}
    row = {c: None for c, _ in SHARD_COLUMNS}
    row.update(
        partition_key=key, raw_uri=str(data_root.raw_shard(key)), selected_uri=str(sel_uri),
        rows_raw=int(rows_raw), rows_selected=int(rows_sel),
        kept_fraction=(rows_sel / rows_raw) if rows_raw else None,
        quality_mean_before=q_before, quality_mean_after=q_after,
        selected_bytes=storage.size(sel_uri),
        report_uri=str(storage.join(data_root.report_dir(key), "report.html")) if metrics else None,
    )
    row.update(mask_scores(data_root, key))
    if "spectrum_flatness_selected" in metrics:
        row["spectrum_flatness_selected"] = float(metrics["spectrum_flatness_selected"])
    return row, (metrics or None)


SELECTED_FACTS = ("rows_raw", "dagster/row_count", "quality_mean_before", "quality_mean_after",
                  "bytes")
MASK_FACTS = ("algorithm", "lamb", "solver", "route", "guard", "f_datamask", "f_quality_topk",
              "f_random", "f_qua_datamask", "f_div_datamask")


def _finite(v):
    return None if v is None or not math.isfinite(float(v)) else float(v)


def shard_row_from_records(data_root: DataRoot, key: str, selected_rec, mask_rec, report_rec,
                           selected_size: int | None) -> tuple[dict, dict | None] | None:
    """One shard's catalog row and its report metrics from the latest materializations of
    ``selected_subset``, ``mask`` and ``shard_report``, opening no file; None when the records
    cannot vouch for the files (a fact missing from older metadata, a selected file whose size
    is not the recorded one, a mask newer than its selection): then the files are read."""
    if selected_rec is None or mask_rec is None:
        return None
    sm, mm = selected_rec.asset_materialization.metadata, mask_rec.asset_materialization.metadata
    if any(f not in sm for f in SELECTED_FACTS) or any(f not in mm for f in MASK_FACTS):
        return None
    if selected_size is None or selected_size != sm["bytes"].value:
        return None
    if mask_rec.storage_id > selected_rec.storage_id:  # the dry run's rule (plan.py)
        return None
    metrics = None
    if report_rec is not None:
        rm = report_rec.asset_materialization.metadata
        if "built" not in rm:
            return None
        if rm["built"].value:
            if "corpus_metrics" not in rm:  # built before the report recorded them
                metrics = report_metrics(data_root, key)
            else:
                metrics = dict(rm["corpus_metrics"].value)
    rows_raw, rows_sel = int(sm["rows_raw"].value), int(sm["dagster/row_count"].value)
    row = {c: None for c, _ in SHARD_COLUMNS}
    row.update(
        partition_key=key, raw_uri=str(data_root.raw_shard(key)),
        selected_uri=str(data_root.selected(key)), rows_raw=rows_raw, rows_selected=rows_sel,
        kept_fraction=(rows_sel / rows_raw) if rows_raw else None,
        quality_mean_before=_finite(sm["quality_mean_before"].value),
        quality_mean_after=_finite(sm["quality_mean_after"].value),
        selected_bytes=int(sm["bytes"].value),
        report_uri=str(storage.join(data_root.report_dir(key), "report.html")) if metrics else None,
        algorithm=mm["algorithm"].value, lamb=mm["lamb"].value, solver=mm["solver"].value,
        route=mm["route"].value, guard=mm["guard"].value or None,
        f_selection=float(mm["f_datamask"].value), f_quality_topk=float(mm["f_quality_topk"].value),
        f_random=float(mm["f_random"].value), f_qua_selection=float(mm["f_qua_datamask"].value),
        f_div_selection=float(mm["f_div_datamask"].value),
    )
    if metrics and metrics.get("spectrum_flatness_selected") is not None:
        row["spectrum_flatness_selected"] = float(metrics["spectrum_flatness_selected"])
    return row, metrics


def selected_sizes(data_root: DataRoot) -> dict:
    """{partition key: bytes} of the selected files, from one listing."""
    try:
        infos = storage.list_file_infos(data_root.selected_root, suffix=".parquet")
    except storage.StorageError:  # not created yet: nothing there
        return {}
    out = {}
    for uri, (size, _) in infos.items():
        try:
            out[storage.partition_key_for(uri)] = size
        except ValueError:  # not a partition's file
            continue
    return out


def catalog_rows(con, instance: dg.DagsterInstance, data_root: DataRoot, keys: list):
    """(catalog rows, {key: report metrics}, keys without a selection, keys read from files):
    from the materialization records where they vouch for the files, else from the files."""
    from datamask_pipeline.plan import _latest_records

    sizes = selected_sizes(data_root)
    listed = [k for k in keys if k in sizes]
    sel = _latest_records(instance, selected_subset.key, listed)
    masks = _latest_records(instance, mask.key, [k for k in listed if k in sel])
    reports = _latest_records(instance, shard_report.key, [k for k in listed if k in sel])
    rows, metrics, missing, from_files = [], {}, [], []
    for key in keys:
        if key not in sizes:
            missing.append(key)
            continue
        got = shard_row_from_records(data_root, key, sel.get(key), masks.get(key),
                                     reports.get(key), sizes[key])
        if got is None:
            if not all(storage.exists(u) for u in (data_root.mask(key), data_root.features(key))):
                missing.append(key)
                continue
            got = shard_row(con, data_root, key)
            from_files.append(key)
        rows.append(got[0])
        metrics[key] = got[1]
    return rows, metrics, missing, from_files


def corpus_report_input(row: dict, report: dict | None) -> dict:
    """A shard's metrics for ``reporting.build_corpus_report``: the catalog's numbers, with the
    shard report's richer metrics on top when one was built."""
    m = {
        "n_rows": row["rows_raw"], "k_selected": row["rows_selected"],
        "kept_fraction": row["kept_fraction"], "quality_mean_shard": row["quality_mean_before"],
        "quality_mean_selected": row["quality_mean_after"], "f_datamask": row["f_selection"],
        "route": selection_label(row["route"], row["guard"]),
        "f_topk": row["f_quality_topk"], "f_random": row["f_random"], "lamb": row["lamb"],
        "spectrum_flatness_selected": row["spectrum_flatness_selected"],
    }
    m.update(report or {})
    return m


@contextlib.contextmanager
def rebuilt_database(catalog: DuckDBResource):
    """A connection to a new, empty database that replaces ``catalog.database`` when the block
    succeeds and is discarded when it raises (the old database stays as it was)."""
    target = catalog.database
    if storage.is_local(target):
        _, final = storage.resolve(target)
        os.makedirs(os.path.dirname(final) or ".", exist_ok=True)
        scratch = None
        tmp = os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.tmp-{uuid.uuid4().hex}")
    else:
        scratch = tempfile.mkdtemp(prefix="datamask-catalog-")
        tmp = os.path.join(scratch, "catalog.duckdb")
    build = DuckDBResource(database=tmp, connection_config=dict(catalog.connection_config))
    try:
        with build.get_connection() as con:
            try:
                yield con
                con.execute("CHECKPOINT")
            finally:
                con.close()
        if scratch is None:
            os.replace(tmp, final)
        else:
            with open(tmp, "rb") as src, storage.atomic_output(target) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    finally:
        for p in (tmp, tmp + ".wal"):
            if os.path.exists(p):
                os.unlink(p)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def write_catalog(con, rows: list, missing: list, data_root: DataRoot) -> None:
    """The catalog's tables and view, in the (new, empty) database of ``con``."""
    cols = ", ".join(f"{q(c)} {t}" for c, t in SHARD_COLUMNS)
    con.execute(f"CREATE TABLE {q('shards')} ({cols})")
    placeholders = ", ".join("?" for _ in SHARD_COLUMNS)
    if rows:
        con.executemany(f"INSERT INTO {q('shards')} VALUES ({placeholders})",
                        [[r[c] for c, _ in SHARD_COLUMNS] for r in rows])
    con.execute(f"CREATE TABLE {q('catalog_info')} (built_at TIMESTAMP, data_root VARCHAR, "
                f"shards_registered BIGINT, shards_without_selection VARCHAR[])")
    con.execute(f"INSERT INTO {q('catalog_info')} VALUES (to_timestamp(?), ?, ?, ?)",
                [time.time(), str(data_root.root), len(rows) + len(missing), sorted(missing)])
    if rows and all(storage.is_local(r["selected_uri"]) for r in rows):
        files = ", ".join(sql_string(storage.resolve(r["selected_uri"])[1]) for r in rows)
        con.execute(
            f"CREATE VIEW {q('selected_rows')} AS SELECT * EXCLUDE (filename), "
            f"regexp_extract(filename, '([^/]+)\\.parquet$', 1) AS partition_key "
            f"FROM read_parquet([{files}], union_by_name = true, filename = true)"
        )


def write_corpus_report(rows: list, missing: list, data_root: DataRoot, reports: dict):
    """The corpus report over the catalog's rows; returns (report, written files)."""
    from datamask_pipeline.reporting.corpus_report import build_corpus_report
    from datamask_pipeline.reporting.corpus_report import write_corpus_report as write

    algorithms = sorted({r["algorithm"] for r in rows if r["algorithm"]})
    links = {r["partition_key"]: f"../reports/{r['partition_key']}/report.html"
             for r in rows if r["report_uri"]}
    report = build_corpus_report(
        {r["partition_key"]: corpus_report_input(r, reports.get(r["partition_key"])) for r in rows},
        algorithm=", ".join(algorithms) or None, links=links,
        extra={"shards without a selection": str(len(missing))},
    )
    return report, write(report, data_root.corpus_report_dir())


def summary_metadata(rows: list, keys: list, missing: list) -> dict:
    total_raw = sum(r["rows_raw"] for r in rows)
    total_sel = sum(r["rows_selected"] for r in rows)
    qb = sum(r["quality_mean_before"] * r["rows_raw"] for r in rows) / total_raw if total_raw else float("nan")
    qa = sum(r["quality_mean_after"] * r["rows_selected"] for r in rows) / total_sel if total_sel else float("nan")

    def fmt(v, spec=".4f"):
        return "–" if v is None else format(v, spec)

    lines = ["| shard | route | rows | selected | kept | quality before | quality after | "
             "f selection | f quality top-k | f random |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['partition_key']} | {selection_label(r['route'], r['guard'])} | "
            f"{r['rows_raw']:,} | {r['rows_selected']:,} | "
            f"{fmt(r['kept_fraction'], '.1%')} | {fmt(r['quality_mean_before'])} | "
            f"{fmt(r['quality_mean_after'])} | {fmt(r['f_selection'], '.5g')} | "
            f"{fmt(r['f_quality_topk'], '.5g')} | {fmt(r['f_random'], '.5g')} |")
    return {
        "dagster/row_count": int(total_sel),
        "shards_registered": len(keys),
        "shards_in_catalog": len(rows),
        "shards_without_selection": dg.MetadataValue.json(missing),
        "rows_raw": int(total_raw),
        "rows_selected": int(total_sel),
        "kept_fraction": float(total_sel / total_raw) if total_raw else 0.0,
        "quality_mean_before": float(qb),
        "quality_mean_after": float(qa),
        "per_shard": dg.MetadataValue.md("\n".join(lines)),
    }


@dg.asset(
    key="corpus_summary",
    deps=[selected_subset, mask, shard_report],
    group_name=GROUP,
    kinds={"duckdb"},
    owners=OWNERS,
    tags=stage("report"),
    freshness_policy=FRESHNESS,
    code_version=CODE_VERSION,
)
@retry_transient_io
def corpus_summary(context: dg.AssetExecutionContext, data_root: DataRoot,
                   catalog: DuckDBResource) -> dg.MaterializeResult:
    """The corpus catalog (the ``catalog`` resource's database, by default
    ``<data root>/catalog.duckdb``) over every registered shard with a selected subset (tables
    ``shards`` and ``catalog_info``, view ``selected_rows``), rebuilt atomically, and the
    corpus report (``<data root>/corpus_report/corpus_report.html``: kept fraction, quality
    before / after and gain over quality top-k per shard). Metadata: totals and a per-shard
    table."""
    keys = sorted(context.instance.get_dynamic_partitions(PARTITIONS_NAME))
    with rebuilt_database(catalog) as con:
        rows, reports, missing, from_files = catalog_rows(con, context.instance, data_root, keys)
        if missing:
            context.log.warning(f"{len(missing)} registered shard(s) have no selected subset "
                                f"yet: {missing[:20]}")
        if from_files:
            context.log.info(f"{len(from_files)} shard(s) read from their files (no complete, "
                             f"consistent materialization records): {from_files[:20]}")
        write_catalog(con, rows, missing, data_root)
    report, files = write_corpus_report(rows, missing, data_root, reports)
    metadata = summary_metadata(rows, keys, missing)
    context.log.info(f"catalog {catalog.database}: {len(rows)} shards, "
                     f"{metadata['rows_selected']} of {metadata['rows_raw']} rows selected")
    return dg.MaterializeResult(metadata={
        **metadata,
        "shards_read_from_files": len(from_files),
        "catalog_uri": dg.MetadataValue.path(str(catalog.database)),
        "corpus_report_html": dg.MetadataValue.path(str(files["html"])),
        "corpus_report": dg.MetadataValue.md(report.markdown),
    })
