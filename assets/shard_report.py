"""The shard report: figures and one HTML page of a shard's selection, outside the gpu pool.

Reads the mask (rows, plus the selection record in its schema metadata), the features and the
raw source column, builds the report with :func:`reporting.build_shard_report` on the CPU (this
step holds no gpu pool slot, so it leaves the GPU to the mask steps) and writes
``reports/<key>/`` (each file atomic, the page last). With ``MaskLearner.shard_report`` off, or
an objective of several diversity terms (the report draws one), the step materializes a "not
built" result and removes the partition's earlier report, so nothing links a stale page.
"""

import contextlib

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from datamask_pipeline.engine import storage
from datamask_pipeline.engine.data import raw_row_numbers
from datamask_pipeline.engine.storage import mask_file
from datamask_pipeline.reporting.numerics import ROW_FIELDS, finite_or_none
from resources.contract import DataContract
from resources.learner import MaskLearner
from resources.storage import DataRoot

from .ingest import GROUP, ID, OWNERS, retry_transient_io, features, stage
from .learn import checked_features, mask
from .partitions import shards

CODE_VERSION = "shard-report-1"
# report metrics shown as numbers in the materialization (plots over partitions)
KEY_METRICS = ("gain_f_over_topk", "gain_f_over_random", "overlap_with_topk",
               "quality_mean_selected", "spectrum_flatness_selected", "spectrum_flatness_topk")


def read_sources(raw_uri: str, column, n: int, rows=None):
    """The raw source/domain column (for the report), or None when absent. ``rows``: the raw
    row numbers of the features' rows when ingestion quarantined some (``engine.data.
    raw_row_numbers``), else None (the features are the raw file row for row)."""
    if not column:
        return None
    fs, path = storage.resolve(raw_uri)
    with fs.open_input_file(path) as fh:
        pf = pq.ParquetFile(fh)
        if column not in pf.schema_arrow.names:
            return None
        col = pf.read(columns=[column]).column(0)
    if rows is not None:
        col = col.take(pa.array(rows))
    if len(col) != n:
        return None
    return np.asarray(col.to_pylist(), dtype=object)


def read_selection(data_root: DataRoot, key: str, ids) -> tuple:
    """The mask's ``selected`` column, aligned row for row with the features' ``ids``, and its
    selection record."""
    uri = data_root.mask(key)
    try:
        table, record = mask_file.read_mask(uri, columns=[ID, "selected"])
    except FileNotFoundError as exc:
        raise dg.Failure(description=f"partition {key!r}: no mask at {uri}: materialize mask "
                                     "first", allow_retries=False) from exc
    except mask_file.MaskFileError as exc:
        raise dg.Failure(description=f"partition {key!r}: {exc}", allow_retries=False) from exc
    if table.num_rows != len(ids) or not np.array_equal(
            table.column(ID).to_numpy(zero_copy_only=False), ids):
        raise dg.Failure(
            description=f"partition {key!r}: {uri} does not match {data_root.features(key)} row "
                        "for row (the features changed after the mask was learned): "
                        "re-materialize mask", allow_retries=False)
    return table.column("selected").to_numpy(zero_copy_only=False).astype(bool), record


@contextlib.contextmanager
def cpu_threads(n: int):
    """torch's CPU thread count set to ``n`` (0: unchanged) for the block. The learner's device
    is not used: this step holds no gpu pool slot."""
    import torch

    old = torch.get_num_threads()
    if n > 0:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def build_report(shard, selected, record: mask_file.SelectionRecord, sources, key: str):
    """The report of one shard (CPU), from the mask's selection record."""
    import torch

    from datamask_pipeline.engine.baselines import quality_topk
    from datamask_pipeline.reporting.shard_report import build_shard_report

    algorithm = record.single_term
    levels = {name: {"f": {algorithm: sc["f"]}, "f_qua": sc["f_qua"],
                     "f_div": {algorithm: sc["f_div"]}} for name, sc in record.scores.items()}
    return build_shard_report(
        torch.as_tensor(shard.embeddings), shard.quality, selected, record.history,
        ids=shard.ids, sources=sources, lamb=record.lamb, algorithm=algorithm, reference=levels,
        title=f"Selection by {record.route}: partition {key}", route=record.route,
        guard=record.guard,
        topk=quality_topk(shard.quality, record.k, shard.ids), device="cpu",
        extra={"partition": key, "config hash": record.config_hash, "device": record.device,
               "solver": f"{record.solver} (ran {record.route})", "steps": record.steps},
    )


def not_built(data_root: DataRoot, key: str, why: str) -> dg.MaterializeResult:
    """The result of a partition without a report; its earlier report is removed."""
    storage.remove(data_root.report_dir(key), recursive=True)
    return dg.MaterializeResult(metadata={"built": False, "reason": why},
                                data_version=dg.DataVersion(f"not built: {why}"))


@dg.asset(
    key="shard_report",
    partitions_def=shards,
    deps=[features, mask],
    group_name=GROUP,
    kinds={"matplotlib", "html"},
    owners=OWNERS,
    tags=stage("report"),
    code_version=CODE_VERSION,
)
@retry_transient_io
def shard_report(context: dg.AssetExecutionContext, data_root: DataRoot,
                 contract: DataContract, learner: MaskLearner) -> dg.MaterializeResult:
    """The shard report of one partition's selection (``reports/<key>/``: ``report.html``,
    PNG figures, ``report_metrics.json``, ``report.md``): optimisation curve, quality
    distributions, embedding projection, eigen-spectrum flatness, retention per source, and
    the whole-shard scores of the selection (named by its route), quality top-k and random from
    the mask's record.
    Metadata: the page's path, its tables, key metrics, the numbers the corpus report takes
    (``corpus_metrics``); or ``built = false`` and the reason."""
    key = context.partition_key
    if not learner.shard_report:
        return not_built(data_root, key, "disabled (MaskLearner.shard_report = false)")
    shard = checked_features(data_root, contract, key)
    selected, record = read_selection(data_root, key, shard.ids)
    if record.single_term is None:
        return not_built(data_root, key, f"the objective {record.term} has several diversity "
                                         "terms; the report draws one")
    sources = read_sources(data_root.raw_shard(key), contract.source_column, shard.n,
                           raw_row_numbers(data_root.features(key)))
    with cpu_threads(learner.cpu_threads):
        report = build_report(shard, selected, record, sources, key)
    from datamask_pipeline.reporting.shard_report import write_shard_report

    files = write_shard_report(report, data_root.report_dir(key))
    context.log.info(f"partition {key}: shard report -> {files['html']}")
    metadata = {"built": True, "report_html": dg.MetadataValue.path(str(files["html"])),
                "report": dg.MetadataValue.md(report.markdown)}
    metadata.update({m: float(report.metrics[m]) for m in KEY_METRICS if m in report.metrics})
    # what the corpus catalog and report take from this shard's report, so corpus_summary reads
    # it here rather than from report_metrics.json (non-finite numbers as null)
    metadata["corpus_metrics"] = dg.MetadataValue.json(
        {src: finite_or_none(report.metrics[src]) for src in sorted(set(ROW_FIELDS.values()))
         if src in report.metrics})
    return dg.MaterializeResult(metadata=metadata,
                                data_version=dg.DataVersion(storage.sha256(files["metrics"])))
