"""Mask learning: the engine's policy-gradient learner on one shard, through ``MaskLearner``.

Reads the validated features, learns one logit per sample, writes ``masks/<key>.parquet``
(``id``, ``logit``, ``rank``, ``selected``) and the shard report, and records the objective
curve, whole-shard scores of DATAMASK next to random and quality top-k, device, steps, wall
time, config hash and the pre-flight memory estimate. Runs in the ``gpu`` concurrency pool
(one learning step per GPU at a time). A checkpoint under the data root lets a retried step
(``RetryPolicy``) resume where the failed attempt stopped; it is deleted once the outputs are
published.

Every method knob is a field of :class:`MaskConfig` (editable in the Launchpad). Defaults are
the paper's GPU settings; with ``DATAMASK_PRESET=cpu-demo`` in the environment of the code
location they are the engine's ``CPU_DEMO_PRESET`` (a 5k-row shard in about a minute on two
CPU cores).
"""

import json
import pickle
import time
from typing import Optional

import dagster as dg
import numpy as np
from pydantic import Field

from datamask_pipeline import settings
from datamask_pipeline.engine import storage
from datamask_pipeline.engine.config import ConfigError, LearnerConfig
from datamask_pipeline.engine.data import Columns, DataContractError
from datamask_pipeline.k8s import GPU_POOL, gpu_op_tags
from resources.contract import DataContract
from resources.learner import MaskLearner
from resources.storage import DataRoot

from .ingest import EMBEDDING, GROUP, ID, QUALITY, features
from .partitions import shards

CODE_VERSION = "mask-1"
MASK_COLUMNS = (ID, "logit", "rank", "selected")
CURVE_ROWS = 12

_D = settings.learner_defaults()


class MaskConfig(dg.Config):
    """The method's knobs (names follow upstream's ``train_mask.py`` flags)."""

    algorithm: str = Field(
        default=_D["algorithm"],
        description="Diversity term f_div: DiSF (decorrelated embedding dimensions), Facility "
        "(facility location: coverage) or Pair_simi (minus mean pair-wise cosine). --algorithm",
    )
    lamb: float = Field(
        default=_D["lamb"],
        description="λ in f = λ·f_qua + (1−λ)·f_div, in [0, 1]; 1 = quality only. The paper "
        "uses 0.5 and recommends 0.1–0.5. --lamb",
    )
    select_ratio: float = Field(
        default=_D["select_ratio"],
        description="Fraction of the shard to keep, in (0, 1): k = round(select_ratio · n). "
        "--select_ratio",
    )
    n_epochs: int = Field(
        default=_D["n_epochs"],
        description="Policy-gradient update steps (5,000 in the upstream README). --n_epochs",
    )
    n_rollout: int = Field(
        default=_D["n_rollout"],
        description="Masks G sampled per step (GRPO-style group); 128–256 recommended, too few "
        "diverges. --n_rollout",
    )
    partial: float = Field(
        default=_D["partial"],
        description="Fraction of the shard drawn as each step's batch, in (0, 1]; diversity is "
        "computed within the batch. 0.05–0.1 recommended. --partial",
    )
    max_lr: float = Field(
        default=_D["max_lr"],
        description="Learning rate at the first step (falls linearly to min_lr). --max_lr",
    )
    min_lr: float = Field(default=_D["min_lr"], description="Learning rate at the last step. --min_lr")
    init: str = Field(
        default=_D["init"],
        description="Initial logits: 'quality' (p_i ∝ normalised quality; starts at quality "
        "top-k) or 'same' (uniform). --init",
    )
    prune_ratio: float = Field(
        default=_D["prune_ratio"],
        description="Drop this bottom fraction by quality before learning, in [0, 1) (the paper "
        "prunes 40–50%; 0 = off).",
    )
    term_norm: str = Field(
        default=_D["term_norm"],
        description="'none' or 'standardize' (z-score f_qua and f_div across the rollouts "
        "before mixing; re-weights λ towards diversity).",
    )
    seed: int = Field(default=_D["seed"], description="Random seed (batches, Gumbel noise, the random baseline).")
    solver: str = Field(
        default=_D["solver"],
        description="'paper': the policy-gradient learner alone; 'paper+polish': then a swap "
        "local search on the whole-shard objective that starts from the learner's read-out "
        "and never lowers f.",
    )
    rollout_chunk: Optional[int] = Field(
        default=_D["rollout_chunk"],
        description="Rollouts scored at once (memory vs speed); unset = chosen from the "
        "objective's memory budget. Does not change the result.",
    )

    def learner_config(self) -> LearnerConfig:
        """The engine's config (raises ConfigError for unknown algorithms)."""
        return LearnerConfig(**{f: getattr(self, f) for f in LearnerConfig.__dataclass_fields__})


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
        return "(no steps run: the result was read from a finished checkpoint or λ = 1)"
    idx = sorted(set(np.linspace(0, len(history) - 1, min(rows, len(history))).round().astype(int)))
    lines = ["| step | lr | mean f | best f | mean f_qua | mean f_div | elapsed s |",
             "|---:|---:|---:|---:|---:|---:|---:|"]
    for i in idx:
        h = history[i]
        lines.append(f"| {h['step']} | {h['lr']:.3g} | {h['mean_f']:.6g} | {h['best_f']:.6g} | "
                     f"{h['mean_f_qua']:.6g} | {h['mean_f_div']:.6g} | {h['elapsed_s']:.2f} |")
    return "\n".join(lines)


def scores_markdown(levels: dict, algorithm: str, lamb: float) -> str:
    lines = [f"| selection | f (λ={lamb:g}, {algorithm}) | f_qua | f_div |", "|---|---:|---:|---:|"]
    for name, ev in levels.items():
        lines.append(f"| {name} | {ev['f'][algorithm]:.6g} | {ev['f_qua']:.6g} | "
                     f"{ev['f_div'][algorithm]:.6g} |")
    return "\n".join(lines)


def _fail(key: str, exc: Exception, what: str) -> dg.Failure:
    return dg.Failure(description=f"partition {key!r}: {what}: {exc}", allow_retries=False)


@dg.asset(
    key="mask",
    partitions_def=shards,
    deps=[features],
    group_name=GROUP,
    kinds={"torch"},
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
    (0 = best) and ``selected`` (rank < k = round(select_ratio · n): the top k by logit, ties
    by id, or the polished subset for solver paper+polish).
    Metadata: objective curve, whole-shard f_qua / f_div / f of DATAMASK vs random vs quality
    top-k, device, steps, wall time, config hash, memory estimate, the shard report."""
    import torch

    from datamask_pipeline.engine.baselines import quality_topk, random_selection
    from datamask_pipeline.engine.evaluate import evaluate_selection, make_ground_set
    from datamask_pipeline.engine.learner import DeviceError, check_quality_scale
    from datamask_pipeline.reporting.shard_report import build_shard_report, write_shard_report

    t0 = time.perf_counter()
    key = context.partition_key
    try:
        cfg = config.learner_config()
        cfg.validate()
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
        f"partition {key}: n={n} d={d} k={sizes['k']} batch={sizes['batch']} k'={sizes['k_batch']} "
        f"algorithm={cfg.algorithm} λ={cfg.lamb} steps={cfg.n_epochs} G={cfg.n_rollout} "
        f"device={device} precision={learner.precision} config_hash={chash} "
        f"memory estimate {estimate['total_bytes'] / 2**20:.1f} MiB of "
        f"{estimate['available_bytes'] / 2**30:.1f} GiB available"
    )

    ckpt = learner.checkpoint_path(key, data_root.checkpoint(key))
    try:
        res = learner.learn(shard.embeddings, shard.quality, cfg, ids=shard.ids,
                            checkpoint_path=ckpt, log=context.log.info)
    except pickle.UnpicklingError as exc:  # an unsafe checkpoint: retrying cannot help
        raise _fail(key, exc, "cannot resume") from exc
    if res.resumed_from is not None:
        context.log.info(f"resumed from the checkpoint at step {res.resumed_from} ({ckpt})")
    k = int(res.selected.sum())

    with learner.session():
        # ---- whole-shard scores (V = all n rows) of DATAMASK and the reference selections
        ground = make_ground_set(shard.embeddings, shard.quality, device=device)
        topk_idx = quality_topk(shard.quality, k, shard.ids)
        rand_idx = random_selection(n, k, seed=cfg.seed)

        def ev(sel):
            return evaluate_selection(None, None, sel, lamb=cfg.lamb, terms=(cfg.algorithm,), ground=ground)

        levels = {"datamask": ev(res.selected_idx), "quality_topk": ev(topk_idx), "random": ev(rand_idx)}
        del ground
        alg = cfg.algorithm

        # ---- report (built before anything is published)
        report = None
        if learner.shard_report:
            sources = read_sources(data_root.raw_shard(key), contract.source_column, n)
            report = build_shard_report(
                torch.as_tensor(shard.embeddings), shard.quality, res.selected, res.history,
                ids=shard.ids, sources=sources, lamb=cfg.lamb, algorithm=alg, reference=levels,
                title=f"DATAMASK selection: partition {key}", topk=topk_idx, device=device,
                extra={"partition": key, "config hash": chash, "device": res.device,
                       "steps": res.steps, "learner wall time (s)": f"{res.wall_time_s:.2f}"},
            )

    # ---- publish: report files, then the mask parquet (each atomic)
    import pyarrow as pa

    report_files = write_shard_report(report, data_root.report_dir(key)) if report else None
    mask_uri = data_root.mask(key)
    table = pa.table({
        ID: pa.array(shard.ids),
        "logit": pa.array(res.logits, pa.float32()),
        "rank": pa.array(res.rank, pa.int64()),
        "selected": pa.array(res.selected, pa.bool_()),
    })
    storage.atomic_write_table(table, mask_uri, compression="zstd")
    digest = storage.sha256(mask_uri)
    storage.remove(ckpt)
    if report is None and storage.exists(data_root.report_dir(key)):
        storage.remove(data_root.report_dir(key), recursive=True)  # it described another run

    f = {name: lv["f"][alg] for name, lv in levels.items()}
    context.log.info(
        f"partition {key}: whole-shard f ({alg}, λ={cfg.lamb}): datamask {f['datamask']:.6g}, "
        f"quality top-k {f['quality_topk']:.6g}, random {f['random']:.6g}; "
        f"{res.steps} steps in {res.wall_time_s:.1f}s on {res.device}"
    )
    history = [{kk: (round(v, 8) if isinstance(v, float) else v) for kk, v in h.items()} for h in res.history]
    metadata = {
        "dagster/row_count": n,
        "dagster/column_schema": dg.TableSchema(columns=[
            dg.TableColumn(ID, str(table.schema.field(ID).type), description="sample id"),
            dg.TableColumn("logit", "float", description="final logit"),
            dg.TableColumn("rank", "int64", description="rank by final logit (0 = best), ties by id"),
            dg.TableColumn("selected", "bool", description=f"rank < k = {k}"),
        ]),
        "k_selected": k,
        "kept_fraction": float(k / n),
        "embedding_dim": d,
        "algorithm": alg,
        "lamb": float(cfg.lamb),
        "device": res.device,
        "precision": learner.precision,
        "steps": int(res.steps),
        "resumed_from_step": int(res.resumed_from or 0),
        "learner_wall_time_s": float(res.wall_time_s),
        "step_wall_time_s": float(time.perf_counter() - t0),
        "config_hash": chash,
        "config": dg.MetadataValue.json(cfg.to_dict()),
        "memory_estimate_bytes": int(estimate["total_bytes"]),
        "memory_estimate": dg.MetadataValue.json(estimate),
        "objective_curve": dg.MetadataValue.md(curve_markdown(res.history)),
        "objective_history": dg.MetadataValue.json(history),
        "whole_shard_scores": dg.MetadataValue.md(scores_markdown(levels, alg, cfg.lamb)),
        "whole_shard_eval": dg.MetadataValue.json(levels),
        "mask_uri": dg.MetadataValue.path(str(mask_uri)),
        "sha256": digest,
    }
    for name, lv in levels.items():
        metadata[f"f_{name}"] = float(lv["f"][alg])
        metadata[f"f_qua_{name}"] = float(lv["f_qua"])
        metadata[f"f_div_{name}"] = float(lv["f_div"][alg])
    if res.polish is not None:  # solver paper+polish: what the swap search changed
        metadata["polish"] = dg.MetadataValue.json(json.loads(json.dumps(res.polish, default=float)))
    if report is not None:
        metadata["report_html"] = dg.MetadataValue.path(str(report_files["html"]))
        metadata["report"] = dg.MetadataValue.md(report.markdown)
    metadata["gain_f_over_quality_topk"] = float(f["datamask"] - f["quality_topk"])
    metadata["gain_f_over_random"] = float(f["datamask"] - f["random"])
    return dg.MaterializeResult(metadata=metadata, data_version=dg.DataVersion(digest))
