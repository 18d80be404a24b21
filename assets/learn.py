"""Mask learning: the engine's selection of one shard, through ``MaskLearner``.

Reads the validated features, selects with the configured solver and publishes
``masks/<key>.parquet`` (``id``, ``logit``, ``rank``, ``selected``) with the selection record
in its schema metadata (:mod:`datamask_pipeline.engine.storage.mask_file`: objective curve,
whole-shard scores of the selection next to random and quality top-k, solver and route, config);
the materialization adds device, timings and the pre-flight memory estimate. Runs in the
``gpu`` concurrency pool (one selection per GPU at a time); the shard report is its own asset
(:mod:`assets.shard_report`), outside the pool. A checkpoint under the data root lets a retried
step (a transient I/O error: ``retry_transient_io``) or a new run resume where the failed
attempt stopped; it is deleted once the mask is published.

Every method knob is a field of :class:`MaskConfig` (editable in the Launchpad), derived from
the engine's ``LearnerConfig``. Defaults are the ``pipeline`` profile (solver ``auto``: the
bench's measured best route); the jobs ``datamask_upstream_job`` (upstream's exact behaviour)
and ``datamask_cpu_demo_job`` (CPU-sized learner knobs) carry the other presets as run config.
The defaults' config hash is part of the asset's code version, so changing a default knob makes
every shard's mask stale in Dagster's own terms (and the scheduled refresh picks it up).
"""

import json
import pickle
import time

import dagster as dg
import numpy as np

from datamask_pipeline.engine import storage
from datamask_pipeline.engine.config import ConfigError, LearnerConfig
from datamask_pipeline.engine.data import Columns, DataContractError
from datamask_pipeline.engine.storage import mask_file
from datamask_pipeline.k8s import GPU_POOL, gpu_op_tags
from resources.contract import DataContract
from resources.learner import MaskLearner
from resources.storage import DataRoot

from .ingest import EMBEDDING, GROUP, ID, OWNERS, QUALITY, retry_transient_io, features, stage
from .mask_config import (  # noqa: F401 - MaskConfig & co. are imported from here too
    InvalidMaskConfig,
    MaskConfig,
    check_run_mask_config,
    default_knobs_hash,
    scheduled_config_hash,
)
from .partitions import shards

CODE_VERSION = "mask-2"
CURVE_ROWS = 12

# The logic's version plus the default knobs' hash (see the module doc).
MASK_CODE_VERSION = f"{CODE_VERSION}+cfg-{default_knobs_hash()}"


def read_features(uri: str, contract: DataContract):
    """The features parquet as an engine Shard, re-checked against the contract (cheap,
    vectorised), so that no step trusts a file the checks did not see."""
    from datamask_pipeline.engine.data import read_shard

    return read_shard(uri, columns=Columns(id=ID, quality=(QUALITY,), embedding=EMBEDDING),
                      expected_dim=contract.expected_dim, quality_range=contract.quality_range)


def curve_markdown(history: list, rows: int = CURVE_ROWS) -> str:
    if not history:
        return ("(no learning steps: the solver runs none, λ = 1, or the result was read from a "
                "finished checkpoint)")
    idx = sorted(set(np.linspace(0, len(history) - 1, min(rows, len(history))).round().astype(int)))
    lines = ["| step | lr | mean f | best f | mean f_qua | mean f_div | elapsed s |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for i in idx:
        h = history[i]
        lines.append(f"| {h['step']} | {h['lr']:.3g} | {h['mean_f']:.6g} | {h['best_f']:.6g} | "
                     f"{h['mean_f_qua']:.6g} | {h['mean_f_div']:.6g} | {h['elapsed_s']:.2f} |")
    return "\n".join(lines)


def scores_markdown(scores: dict, term: str, lamb: float, route: str | None = None,
                    guard: str | None = None) -> str:
    """The whole-shard scores table; the selection's row (the record's ``datamask``) is named
    by the route that produced it ("DATAMASK" only where the learner ran)."""
    from datamask_pipeline.reporting.numerics import selection_label

    lines = [f"| selection | f (λ={lamb:g}, {term}) | f_qua | f_div |", "|---|---:|---:|---:|"]
    for name, sc in scores.items():
        label = selection_label(route, guard) if name == "datamask" else name
        lines.append(f"| {label} | {sc['f']:.6g} | {sc['f_qua']:.6g} | {sc['f_div']:.6g} |")
    return "\n".join(lines)


def _fail(key: str, exc: Exception, what: str) -> dg.Failure:
    """A readable failure without retries; raised ``from None`` where the description already
    says everything, so the cause's line and stack trace are not printed a second time."""
    return dg.Failure(description=f"partition {key!r}: {what}: {exc}", allow_retries=False)


def valid_config(config: MaskConfig, key: str) -> LearnerConfig:
    try:
        return config.learner_config()
    except ConfigError as exc:
        raise _fail(key, exc, "invalid configuration") from None


def checked_features(data_root: DataRoot, contract: DataContract, key: str):
    """The partition's features as an engine Shard; a missing file or a contract breach fails
    the step without retries."""
    uri = data_root.features(key)
    if not storage.exists(uri):
        raise dg.Failure(description=f"partition {key!r}: no features at {uri}: materialize "
                                     "features (and its checks) first", allow_retries=False)
    try:
        return read_features(uri, contract)
    except DataContractError as exc:
        raise _fail(key, exc, "features do not satisfy the data contract") from None


def preflight(learner: MaskLearner, shard, cfg: LearnerConfig, key: str, log) -> dict:
    """Check the config against the shard and the device before any work; returns the
    engine's memory estimate."""
    from datamask_pipeline.engine.device import DeviceError
    from datamask_pipeline.engine.learner import check_quality_scale

    try:
        cfg.validate(shard.n)
        check_quality_scale(shard.quality, learner.dtype())
        estimate = learner.estimate(shard.n, shard.d, cfg,
                                    resident_bytes=int(getattr(shard.embeddings, "nbytes", 0)))
        device = learner.torch_device()
    except (ConfigError, DeviceError) as exc:
        raise _fail(key, exc, "cannot run this configuration here") from None
    log.info(
        f"partition {key}: n={shard.n} d={shard.d} k={cfg.sizes(shard.n)['k']} "
        f"term={cfg.term_label} λ={cfg.lamb} solver={cfg.solver} device={device} "
        f"precision={learner.precision} config_hash={cfg.config_hash()} "
        f"memory estimate {estimate['total_bytes'] / 2**20:.1f} MiB of "
        f"{estimate['available_bytes'] / 2**30:.1f} GiB available"
    )
    return estimate


def run_selection(learner: MaskLearner, shard, cfg: LearnerConfig, ckpt: str, key: str, log):
    """The engine's selection, resuming from ``ckpt`` when a previous attempt left one."""
    try:
        sel = learner.select(shard, cfg, checkpoint_path=ckpt, log=log.info)
    except pickle.UnpicklingError as exc:  # an unsafe checkpoint: retrying cannot help
        raise _fail(key, exc, "cannot resume") from exc
    except ConfigError as exc:
        raise _fail(key, exc, "cannot run this configuration here") from exc
    if sel.resumed_from is not None:
        log.info(f"resumed from the checkpoint at step {sel.resumed_from} ({ckpt})")
    for note in sel.notes + ([sel.guard] if sel.guard else []):
        log.info(f"partition {key}: {note}")
    log.info(
        f"partition {key}: whole-shard f ({cfg.term_label}, λ={cfg.lamb}): selection "
        f"{sel.scores['selection'].f:.6g}, quality top-k {sel.scores['quality_topk'].f:.6g}, "
        f"random {sel.scores['random'].f:.6g}; {sel.route} in {sel.timings['total_s']:.1f}s "
        f"on {sel.device}"
    )
    return sel


@dg.asset(
    key="mask",
    partitions_def=shards,
    deps=[features],
    group_name=GROUP,
    kinds={"torch"},
    owners=OWNERS,
    tags=stage("learn"),
    code_version=MASK_CODE_VERSION,
    pool=GPU_POOL,
    # On Kubernetes (k8s_job_executor) the step's pod asks for the GPU: these tags travel with
    # the asset, so UI launches, backfills and schedules all honour them.
    op_tags=gpu_op_tags(),
)
@retry_transient_io
def mask(context: dg.AssetExecutionContext, config: MaskConfig, data_root: DataRoot,
         contract: DataContract, learner: MaskLearner) -> dg.MaterializeResult:
    """Per-sample selection of one shard (by the configured solver's route): ``id``, ``logit`` (final), ``rank``
    (0 = best; ``rank < k`` is the selection) and ``selected``, from the engine's
    ``select_shard`` with the configured solver. The file's schema metadata carries the
    selection record (``datamask.selection``: scores, history, route, config).
    Metadata: solver and route, objective curve, whole-shard f_qua / f_div / f of the selection
    vs random vs quality top-k, device, steps, timings, config hash, memory estimate."""
    t0 = time.perf_counter()
    key = context.partition_key
    cfg = valid_config(config, key)
    shard = checked_features(data_root, contract, key)
    estimate = preflight(learner, shard, cfg, key, context.log)
    ckpt = learner.checkpoint_path(key, data_root.checkpoint(key))
    sel = run_selection(learner, shard, cfg, ckpt, key, context.log)

    record = mask_file.SelectionRecord.from_selection(sel, cfg)
    table = mask_file.mask_table(shard.ids, sel.logits, sel.rank, sel.selected, record, id_column=ID)
    uri = data_root.mask(key)
    mask_file.write_mask(uri, table)
    storage.remove(ckpt)
    digest = storage.sha256(uri)
    return dg.MaterializeResult(
        metadata=mask_metadata(record, table, estimate, learner.precision, uri=uri, digest=digest,
                               embedding_dim=shard.d, wall_s=time.perf_counter() - t0),
        data_version=dg.DataVersion(digest))


def mask_metadata(record: mask_file.SelectionRecord, table, estimate: dict, precision: str, *,
                  uri: str, digest: str, embedding_dim: int, wall_s: float) -> dict:
    """The ``mask`` materialization's metadata, built in one place from the selection record."""
    n, k = record.n, record.k
    history = [{kk: (round(v, 8) if isinstance(v, float) else v) for kk, v in h.items()}
               for h in record.history]
    md = {
        "dagster/row_count": n,
        "dagster/column_schema": dg.TableSchema(columns=[
            dg.TableColumn(ID, str(table.schema.field(ID).type), description="sample id"),
            dg.TableColumn("logit", "float", description="final logit (quality-initialised when "
                                                          "the solver runs no learning steps)"),
            dg.TableColumn("rank", "int64", description="0 = best; the selection ranks first"),
            dg.TableColumn("selected", "bool", description=f"rank < k = {k}"),
        ]),
        "k_selected": k,
        "kept_fraction": float(k / n),
        "embedding_dim": int(embedding_dim),
        "algorithm": record.term,
        "lamb": record.lamb,
        "solver": record.solver,
        "route": record.route,
        "guard": record.guard,
        "device": record.device,
        "precision": precision,
        "steps": record.steps,
        "resumed_from_step": record.resumed_from,
        "learner_wall_time_s": float(record.timings.get("learn_s", 0.0)),
        "step_wall_time_s": float(wall_s),
        "solver_timings_s": dg.MetadataValue.json({kk: float(v) for kk, v in record.timings.items()}),
        "config_hash": record.config_hash,
        "config": dg.MetadataValue.json(record.config),
        "memory_estimate_bytes": int(estimate["total_bytes"]),
        "memory_estimate": dg.MetadataValue.json(estimate),
        "objective_curve": dg.MetadataValue.md(curve_markdown(record.history)),
        "objective_history": dg.MetadataValue.json(history),
        "whole_shard_scores": dg.MetadataValue.md(scores_markdown(record.scores, record.term,
                                                                  record.lamb, record.route,
                                                                  record.guard)),
        "whole_shard_eval": dg.MetadataValue.json(record.scores),
        "mask_uri": dg.MetadataValue.path(str(uri)),
        "sha256": digest,
    }
    for name, sc in record.scores.items():
        md[f"f_{name}"] = float(sc["f"])
        md[f"f_qua_{name}"] = float(sc["f_qua"])
        md[f"f_div_{name}"] = float(sc["f_div"])
    if record.polish is not None:
        md["polish"] = dg.MetadataValue.json(json.loads(json.dumps(record.polish, default=float)))
    md["gain_f_over_quality_topk"] = record.f("datamask") - record.f("quality_topk")
    md["gain_f_over_random"] = record.f("datamask") - record.f("random")
    return md
