"""The corpus summary: one DuckDB catalog over every selected shard.

This unpartitioned asset is the only writer of ``<data root>/catalog.duckdb``. It rebuilds the
catalog from scratch in a temporary database beside the target and renames it into place, so
readers see either the previous catalog or the complete new one (for an object-store data root
the database is built in a local temporary directory and uploaded atomically). Per-partition
steps never touch it, so parallel partitions never contend for a DuckDB lock.

Catalog contents:

* ``shards``: one row per registered shard with a selected subset: partition key, file URIs,
  rows before and after selection, kept fraction, mean quality before and after, and the
  whole-shard objective of DATAMASK, quality top-k and random (recorded by the mask step);
* ``catalog_info``: when and from where the catalog was built, and which registered shards
  have no selection yet;
* ``selected_rows`` (local data roots): a view over all selected parquet files, every raw
  column plus ``partition_key``.
"""

import json
import os
import tempfile
import time
import uuid

import dagster as dg

from datamask_pipeline.engine import storage
from resources.storage import DataRoot

from .ingest import FRESHNESS, ID, OWNERS, QUALITY, stage
from .partitions import PARTITIONS_NAME
from .select import selected_subset

CODE_VERSION = "catalog-1"
GROUP = "corpus"

SHARD_COLUMNS = [
    ("partition_key", "VARCHAR"), ("raw_uri", "VARCHAR"), ("selected_uri", "VARCHAR"),
    ("rows_raw", "BIGINT"), ("rows_selected", "BIGINT"), ("kept_fraction", "DOUBLE"),
    ("quality_mean_before", "DOUBLE"), ("quality_mean_after", "DOUBLE"),
    ("selected_bytes", "BIGINT"), ("algorithm", "VARCHAR"), ("lamb", "DOUBLE"),
    ("f_datamask", "DOUBLE"), ("f_quality_topk", "DOUBLE"), ("f_random", "DOUBLE"),
    ("f_qua_datamask", "DOUBLE"), ("f_div_datamask", "DOUBLE"),
    ("spectrum_flatness_selected", "DOUBLE"), ("report_uri", "VARCHAR"),
]
# latest ``mask`` materialization metadata key -> catalog column
MASK_METADATA = {
    "algorithm": "algorithm", "lamb": "lamb", "f_datamask": "f_datamask",
    "f_quality_topk": "f_quality_topk", "f_random": "f_random",
    "f_qua_datamask": "f_qua_datamask", "f_div_datamask": "f_div_datamask",
}


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


def mask_metadata(key: str, instance) -> dict:
    """The whole-shard scores recorded by the latest ``mask`` materialization of ``key``."""
    recs = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("mask"), asset_partitions=[key]), limit=1).records
    if not recs:
        return {}
    meta = recs[0].asset_materialization.metadata
    return {dst: meta[src].value for src, dst in MASK_METADATA.items() if src in meta}


def shard_row(con, data_root: DataRoot, key: str, instance) -> dict:
    """One shard's catalog row: counts and quality from DuckDB over the features and mask
    parquet, objective numbers from the latest mask materialization, spectrum flatness from
    the shard report (when one was written)."""
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
    report_dir = data_root.report_dir(key)
    metrics = _read_json(storage.join(report_dir, "report_metrics.json")) or {}
    row = {c: None for c, _ in SHARD_COLUMNS}
    row.update(
        partition_key=key, raw_uri=str(data_root.raw_shard(key)), selected_uri=str(sel_uri),
        rows_raw=int(rows_raw), rows_selected=int(rows_sel),
        kept_fraction=(rows_sel / rows_raw) if rows_raw else None,
        quality_mean_before=q_before, quality_mean_after=q_after,
        selected_bytes=storage.size(sel_uri),
        report_uri=str(storage.join(report_dir, "report.html")) if metrics else None,
    )
    row.update(mask_metadata(key, instance))
    if "spectrum_flatness_selected" in metrics:
        row["spectrum_flatness_selected"] = float(metrics["spectrum_flatness_selected"])
    return row


def corpus_report_input(row: dict, data_root: DataRoot) -> dict:
    """A shard's metrics for ``reporting.build_corpus_report``: the catalog's numbers, with the
    shard report's richer metrics on top when one was written."""
    m = {
        "n_rows": row["rows_raw"], "k_selected": row["rows_selected"],
        "kept_fraction": row["kept_fraction"], "quality_mean_shard": row["quality_mean_before"],
        "quality_mean_selected": row["quality_mean_after"], "f_datamask": row["f_datamask"],
        "f_topk": row["f_quality_topk"], "f_random": row["f_random"], "lamb": row["lamb"],
        "spectrum_flatness_selected": row["spectrum_flatness_selected"],
    }
    report = _read_json(storage.join(data_root.report_dir(row["partition_key"]), "report_metrics.json"))
    if report:
        m.update(report)
    return m


def build_catalog(db_path: str, rows: list, missing: list, data_root: DataRoot, local: bool) -> None:
    import duckdb

    con = duckdb.connect(db_path)
    try:
        cols = ", ".join(f"{q(c)} {t}" for c, t in SHARD_COLUMNS)
        con.execute(f"CREATE TABLE {q('shards')} ({cols})")
        placeholders = ", ".join("?" for _ in SHARD_COLUMNS)
        for r in rows:
            con.execute(f"INSERT INTO {q('shards')} VALUES ({placeholders})",
                        [r[c] for c, _ in SHARD_COLUMNS])
        con.execute(f"CREATE TABLE {q('catalog_info')} (built_at TIMESTAMP, data_root VARCHAR, "
                    f"shards_registered BIGINT, shards_without_selection VARCHAR[])")
        con.execute(f"INSERT INTO {q('catalog_info')} VALUES (to_timestamp(?), ?, ?, ?)",
                    [time.time(), str(data_root.root), len(rows) + len(missing), sorted(missing)])
        if local and rows:
            files = ", ".join(sql_string(storage.resolve(r["selected_uri"])[1]) for r in rows)
            con.execute(
                f"CREATE VIEW {q('selected_rows')} AS SELECT * EXCLUDE (filename), "
                f"regexp_extract(filename, '([^/]+)\\.parquet$', 1) AS partition_key "
                f"FROM read_parquet([{files}], union_by_name = true, filename = true)"
            )
        con.execute("CHECKPOINT")
    finally:
        con.close()


@dg.asset(
    key="corpus_summary",
    deps=[selected_subset],
    group_name=GROUP,
    kinds={"duckdb"},
    owners=OWNERS,
    tags=stage("report"),
    freshness_policy=FRESHNESS,
    code_version=CODE_VERSION,
)
def corpus_summary(context: dg.AssetExecutionContext, data_root: DataRoot) -> dg.MaterializeResult:
    """The corpus catalog ``<data root>/catalog.duckdb`` over every registered shard with a
    selected subset (tables ``shards`` and ``catalog_info``, view ``selected_rows``), rebuilt
    atomically, and the corpus report (``<data root>/corpus_report/corpus_report.html``:
    kept fraction, quality before / after and gain over quality top-k per shard). Metadata:
    totals and a per-shard table."""
    import duckdb

    from datamask_pipeline.reporting.corpus_report import build_corpus_report, write_corpus_report

    keys = sorted(context.instance.get_dynamic_partitions(PARTITIONS_NAME))
    ready, missing = [], []
    for key in keys:
        ok = all(storage.exists(u) for u in (data_root.selected(key), data_root.mask(key),
                                             data_root.features(key)))
        (ready if ok else missing).append(key)
    if missing:
        context.log.warning(f"{len(missing)} registered shard(s) have no selected subset yet: "
                            f"{missing[:20]}")

    rows = []
    scratch = duckdb.connect(":memory:")
    try:
        for key in ready:
            rows.append(shard_row(scratch, data_root, key, context.instance))
    finally:
        scratch.close()

    catalog = data_root.catalog()
    local = storage.is_local(catalog)
    if local:
        _, final = storage.resolve(catalog)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        tmp = os.path.join(os.path.dirname(final), f".catalog.duckdb.tmp-{uuid.uuid4().hex}")
        try:
            build_catalog(tmp, rows, missing, data_root, local=True)
            os.replace(tmp, final)
        finally:
            for p in (tmp, tmp + ".wal"):
                if os.path.exists(p):
                    os.unlink(p)
    else:
        with tempfile.TemporaryDirectory() as d:
            tmp = os.path.join(d, "catalog.duckdb")
            build_catalog(tmp, rows, missing, data_root, local=False)
            with open(tmp, "rb") as src, storage.atomic_output(catalog) as dst:
                while True:
                    chunk = src.read(1 << 20)
                    if not chunk:
                        break
                    dst.write(chunk)

    algorithms = sorted({r["algorithm"] for r in rows if r["algorithm"]})
    links = {r["partition_key"]: f"../reports/{r['partition_key']}/report.html"
             for r in rows if r["report_uri"]}
    corpus_report = build_corpus_report(
        {r["partition_key"]: corpus_report_input(r, data_root) for r in rows},
        algorithm=", ".join(algorithms) or None, links=links,
        extra={"shards without a selection": str(len(missing))},
    )
    report_files = write_corpus_report(corpus_report, data_root.corpus_report_dir())

    total_raw = sum(r["rows_raw"] for r in rows)
    total_sel = sum(r["rows_selected"] for r in rows)
    qb = sum(r["quality_mean_before"] * r["rows_raw"] for r in rows) / total_raw if total_raw else float("nan")
    qa = sum(r["quality_mean_after"] * r["rows_selected"] for r in rows) / total_sel if total_sel else float("nan")

    def fmt(v, spec=".4f"):
        return "–" if v is None else format(v, spec)

    lines = ["| shard | rows | selected | kept | quality before | quality after | f DATAMASK | "
             "f quality top-k | f random |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(
            f"| {r['partition_key']} | {r['rows_raw']:,} | {r['rows_selected']:,} | "
            f"{fmt(r['kept_fraction'], '.1%')} | {fmt(r['quality_mean_before'])} | "
            f"{fmt(r['quality_mean_after'])} | {fmt(r['f_datamask'], '.5g')} | "
            f"{fmt(r['f_quality_topk'], '.5g')} | {fmt(r['f_random'], '.5g')} |")
    context.log.info(f"catalog {catalog}: {len(rows)} shards, {total_sel} of {total_raw} rows selected")
    return dg.MaterializeResult(metadata={
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
        "catalog_uri": dg.MetadataValue.path(str(catalog)),
        "corpus_report_html": dg.MetadataValue.path(str(report_files["html"])),
        "corpus_report": dg.MetadataValue.md(corpus_report.markdown),
    })
