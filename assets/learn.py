"""Mask learning: the engine's policy-gradient learner on one shard, through ``MaskLearner``.

Reads the validated features, learns one logit per sample, writes ``masks/<key>.parquet``
(``id``, ``logit``, ``rank``, ``selected``) and the shard report, and records the objective
curve, whole-shard scores of DATAMASK next to random and quality top-k, device, steps, wall
time, config hash and the pre-flight memory estimate. Runs in the ``gpu`` concurrency pool
(one learning step per GPU at a time). A checkpoint under the data root lets a retried step
(``RetryPolicy``) resume where the failed attempt stopped; it is deleted once the outputs are
published.

Every method knob is a field of :class:`MaskConfig` (editable in the Launchpad), derived from
the engine's ``LearnerConfig``. Defaults are the ``pipeline`` profile (solver ``auto``: the
bench's measured best route); ``DATAMASK_PRESET=upstream`` gives upstream's exact behaviour and
``cpu-demo`` the pipeline profile with CPU-sized learner knobs.
"""

import json
import pickle
import time
from typing import Optional

import dagster as dg
import numpy as np
from pydantic import Field, create_model

from datamask_pipeline import settings
from datamask_pipeline.engine import storage
from datamask_pipeline.engine.config import ConfigError, LearnerConfig
from datamask_pipeline.engine.data import Columns, DataContractError
from datamask_pipeline.k8s import GPU_POOL, gpu_op_tags
from resources.contract import DataContract
from resources.learner import MaskLearner
from resources.storage import DataRoot

from .ingest import EMBEDDING, GROUP, ID, OWNERS, QUALITY, features, stage
from .partitions import shards

CODE_VERSION = "mask-1"
MASK_COLUMNS = (ID, "logit", "rank", "selected")
CURVE_ROWS = 12

class _MaskConfigBase(dg.Config):
    def learner_config(self) -> LearnerConfig:
        """The engine's config (raises ConfigError naming the knob for an impossible value)."""
        return LearnerConfig(**{f: getattr(self, f) for f in LearnerConfig.model_fields})


def _mask_config_class():
    """``MaskConfig``: every field of the engine's LearnerConfig (type, description), with the
    defaults of the pipeline's profile (``DATAMASK_PRESET``). Ranges are checked by the engine
    when the step starts, so a bad value fails the step with the knob named."""
    defaults = settings.learner_defaults()
    fields = {name: (info.annotation, Field(default=defaults[name], description=info.description))
              for name, info in LearnerConfig.model_fields.items()}
    return create_model("MaskConfig", __base__=_MaskConfigBase,
                        __doc__="The method's knobs (names follow upstream's train_mask.py flags).",
                        **fields)


MaskConfig = _mask_config_class()


def scheduled_config_hash() -> str:
    """The config hash of a run launched with the default config (schedules, sensors)."""
    return MaskConfig().learner_config().config_hash()


def read_features(uri: str, contract: DataContract):
    """The features parquet as an engine Shard, re-checked against the contract (cheap,
    vectorised), so that this step never trusts a file the checks did not see."""
    from datamask_pipeline.engine.data import read_shard

    return read_shard(uri, columns=Columns(id=ID, quality=(QUALITY,), embedding=EMBEDDING),
                      expected_dim=contract.expected_dim, quality_range=contract.quality_range)


def read_sources(raw_uri: str, column: Optional[str], n: int):
    """The raw source/domain column (for the report), or None when absent."""
    import pyarrow.parquet as pq

    if not column:
        return None
    fs, path = storage.resolve(raw_uri)
    with fs.open_input_file(path) as fh:
        pf = pq.ParquetFile(fh)
        if column not in pf.schema_arrow.names:
            return None
        col = pf.read(columns=[column]).column(0)
    if len(col) != n:
        return None
    return np.asarray(col.to_pylist(), dtype=object)


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


def scores_markdown(scores: dict, term: str, lamb: float) -> str:
    lines = [f"| selection | f (λ={lamb:g}, {term}) | f_qua | f_div |", "|---|---:|---:|---:|"]
    for name, sc in scores.items():
        lines.append(f"| {name} | {sc.f:.6g} | {sc.f_qua:.6g} | {sc.f_div:.6g} |")
    return "\n".join(lines)


def _fail(key: str, exc: Exception, what: str) -> dg.Failure:
    return dg.Failure(description=f"partition {key!r}: {what}: {exc}", allow_retries=False)


@dg.asset(
    key="mask",
    partitions_def=shards,
    deps=[features],
    group_name=GROUP,
    kinds={"torch"},
    owners=OWNERS,
    tags=stage("learn"),
    code_version=CODE_VERSION,
    pool=GPU_POOL,
    # On Kubernetes (k8s_job_executor) the step's pod asks for the GPU: these tags travel with
    # the asset, so UI launches, backfills and schedules all honour them.
    op_tags=gpu_op_tags(),
    retry_policy=dg.RetryPolicy(max_retries=2, delay=5),
)
def mask(context: dg.AssetExecutionContext, config: MaskConfig, data_root: DataRoot,
         contract: DataContract, learner: MaskLearner) -> dg.MaterializeResult:
    """Per-sample DATAMASK selection of one shard: ``id``, ``logit`` (final), ``rank``
    (0 = best; ``rank < k`` is the selection) and ``selected``, from the engine's
    ``select_shard`` with the configured solver.
    Metadata: solver and route, objective curve, whole-shard f_qua / f_div / f of the selection
    vs random vs quality top-k, device, steps, timings, config hash, memory estimate, report."""
    import torch

    from datamask_pipeline.engine.device import DeviceError
    from datamask_pipeline.engine.learner import check_quality_scale
    from datamask_pipeline.reporting.shard_report import build_shard_report, write_shard_report

    t0 = time.perf_counter()
    key = context.partition_key
    try:
        cfg = config.learner_config()
    except ConfigError as exc:
        raise _fail(key, exc, "invalid configuration") from exc
    feats_uri = data_root.features(key)
    if not storage.exists(feats_uri):
        raise dg.Failure(description=f"partition {key!r}: no features at {feats_uri}: materialize "
                                     "features (and its checks) first", allow_retries=False)
    try:
        shard = read_features(feats_uri, contract)
    except DataContractError as exc:
        raise _fail(key, exc, "features do not satisfy the data contract") from exc
    n, d = shard.n, shard.d
    try:
        cfg.validate(n)
        check_quality_scale(shard.quality, learner.dtype())
        estimate = learner.estimate(n, d, cfg)
        device = learner.torch_device()
    except (ConfigError, DeviceError) as exc:
        raise _fail(key, exc, "cannot run this configuration here") from exc
    sizes = cfg.sizes(n)
    chash = cfg.config_hash()
    context.log.info(
        f"partition {key}: n={n} d={d} k={sizes['k']} term={cfg.term_label} λ={cfg.lamb} "
        f"solver={cfg.solver} device={device} precision={learner.precision} config_hash={chash} "
        f"memory estimate {estimate['total_bytes'] / 2**20:.1f} MiB of "
        f"{estimate['available_bytes'] / 2**30:.1f} GiB available"
    )

    ckpt = learner.checkpoint_path(key, data_root.checkpoint(key))
    try:
        sel = learner.select(shard, cfg, checkpoint_path=ckpt, log=context.log.info)
    except pickle.UnpicklingError as exc:  # an unsafe checkpoint: retrying cannot help
        raise _fail(key, exc, "cannot resume") from exc
    except ConfigError as exc:
        raise _fail(key, exc, "cannot run this configuration here") from exc
    if sel.resumed_from is not None:
        context.log.info(f"resumed from the checkpoint at step {sel.resumed_from} ({ckpt})")
    for note in sel.notes + ([sel.guard] if sel.guard else []):
        context.log.info(f"partition {key}: {note}")
    k = sel.k
    names = {"selection": "datamask", "quality_topk": "quality_topk", "random": "random",
             "learner_readout": "learner_readout"}
    scores = {names[name]: sc for name, sc in sel.scores.items()}

    # ---- report (built before anything is published; single-term objectives)
    report = None
    if learner.shard_report and cfg.terms is None:
        from datamask_pipeline.engine.baselines import quality_topk

        levels = {name: {"f": {cfg.algorithm: sc.f}, "f_qua": sc.f_qua,
                         "f_div": {cfg.algorithm: sc.f_div}} for name, sc in scores.items()}
        with learner.session():
            sources = read_sources(data_root.raw_shard(key), contract.source_column, n)
            report = build_shard_report(
                torch.as_tensor(shard.embeddings), shard.quality, sel.selected, sel.history,
                ids=shard.ids, sources=sources, lamb=cfg.lamb, algorithm=cfg.algorithm,
                reference=levels, title=f"DATAMASK selection: partition {key}",
                topk=quality_topk(shard.quality, k, shard.ids), device=device,
                extra={"partition": key, "config hash": chash, "device": sel.device,
                       "solver": f"{sel.solver} (ran {sel.route})", "steps": sel.steps,
                       "solver wall time (s)": f"{sel.timings['total_s']:.2f}"},
            )

    # ---- publish: report files, then the mask parquet (each atomic)
    import pyarrow as pa

    report_files = write_shard_report(report, data_root.report_dir(key)) if report else None
    mask_uri = data_root.mask(key)
    table = pa.table({
        ID: pa.array(shard.ids),
        "logit": pa.array(sel.logits, pa.float32()),
        "rank": pa.array(sel.rank, pa.int64()),
        "selected": pa.array(sel.selected, pa.bool_()),
    })
    storage.atomic_write_table(table, mask_uri, compression="zstd")
    digest = storage.sha256(mask_uri)
    storage.remove(ckpt)
    if report is None and storage.exists(data_root.report_dir(key)):
        storage.remove(data_root.report_dir(key), recursive=True)  # it described another run

    f = {name: sc.f for name, sc in scores.items()}
    context.log.info(
        f"partition {key}: whole-shard f ({cfg.term_label}, λ={cfg.lamb}): selection "
        f"{f['datamask']:.6g}, quality top-k {f['quality_topk']:.6g}, random {f['random']:.6g}; "
        f"{sel.route} in {sel.timings['total_s']:.1f}s on {sel.device}"
    )
    metadata = mask_metadata(sel, cfg, scores, table, estimate, learner.precision)
    metadata.update({
        "embedding_dim": d,
        "step_wall_time_s": float(time.perf_counter() - t0),
        "mask_uri": dg.MetadataValue.path(str(mask_uri)),
        "sha256": digest,
    })
    if report is not None:
        metadata["report_html"] = dg.MetadataValue.path(str(report_files["html"]))
        metadata["report"] = dg.MetadataValue.md(report.markdown)
    return dg.MaterializeResult(metadata=metadata, data_version=dg.DataVersion(digest))


def mask_metadata(sel, cfg: LearnerConfig, scores: dict, table, estimate: dict,
                  precision: str) -> dict:
    """The ``mask`` materialization's metadata, built in one place from the Selection."""
    n, k = int(sel.selected.size), sel.k
    history = [{kk: (round(v, 8) if isinstance(v, float) else v) for kk, v in h.items()}
               for h in sel.history]
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
        "algorithm": cfg.term_label,
        "lamb": float(cfg.lamb),
        "solver": cfg.solver,
        "route": sel.route,
        "guard": sel.guard or "",
        "device": sel.device,
        "precision": precision,
        "steps": int(sel.steps),
        "resumed_from_step": int(sel.resumed_from or 0),
        "learner_wall_time_s": float(sel.timings.get("learn_s", 0.0)),
        "solver_timings_s": dg.MetadataValue.json({kk: float(v) for kk, v in sel.timings.items()}),
        "config_hash": sel.config_hash,
        "config": dg.MetadataValue.json(cfg.to_dict()),
        "memory_estimate_bytes": int(estimate["total_bytes"]),
        "memory_estimate": dg.MetadataValue.json(estimate),
        "objective_curve": dg.MetadataValue.md(curve_markdown(sel.history)),
        "objective_history": dg.MetadataValue.json(history),
        "whole_shard_scores": dg.MetadataValue.md(scores_markdown(scores, cfg.term_label, cfg.lamb)),
        "whole_shard_eval": dg.MetadataValue.json({kk: sc.as_dict() for kk, sc in scores.items()}),
    }
    for name, sc in scores.items():
        md[f"f_{name}"] = float(sc.f)
        md[f"f_qua_{name}"] = float(sc.f_qua)
        md[f"f_div_{name}"] = float(sc.f_div)
    if sel.polish is not None:
        md["polish"] = dg.MetadataValue.json(json.loads(json.dumps(sel.polish, default=float)))
    md["gain_f_over_quality_topk"] = float(scores["datamask"].f - scores["quality_topk"].f)
    md["gain_f_over_random"] = float(scores["datamask"].f - scores["random"].f)
    return md
