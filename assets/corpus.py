"""The corpus stage's assets: deduplicate the corpus, select one budget over every shard,
write each shard's selected raw rows (the work: ``engine.corpus``; the tables and the page:
``reporting.corpus_selection_report``).

``corpus_dedup`` records the duplicates across every shard that passed its checks
(``corpus/duplicates.parquet``); ``corpus_selection`` selects the corpus budget with
``select_corpus``, whose per-shard tasks write each shard's selected rows
(``corpus/selection/<version>/<key>.parquet``: shard, raw file, row number, id), and publishes
them with ``corpus/selection.json`` (the run's facts and the manifest); ``corpus_subset``
writes each shard's selected raw rows to ``selected/<key>.parquet`` (one task per shard, where
the selection ran), rewriting only the shards whose selection changed, and removes the files of
shards that left the corpus.
"""

import contextlib
import functools

import dagster as dg

from datamask_pipeline.engine import storage
from datamask_pipeline.engine.config import ConfigError
from datamask_pipeline.engine.corpus.duplicates import (dedup_keep, dedup_local, dedup_on_ray,
                                                         duplicate_sample, lineage_ids,
                                                         read_facts, write_duplicates)
from datamask_pipeline.engine.corpus.executor import pick_engine
from datamask_pipeline.engine.corpus.outputs import (SelectionFiles, SubsetError,
                                                      last_selection, selection_digest,
                                                      selection_facts,
                                                      source_shares, write_selection,
                                                      write_subsets)
from datamask_pipeline.engine.corpus.shards import open_shards, read_tokens
from datamask_pipeline.engine.data import DataContractError
from datamask_pipeline.reporting.corpus_selection_report import (dedup_md, scores_md,
                                                                 shares_md, sources_md)
from resources.contract import DataContract
from resources.learner import MaskLearner
from resources.ray import RayCluster
from resources.storage import DataRoot

from .corpus_config import CorpusConfig, DedupConfig, dedup_engine
from .ingest import OWNERS, retry_transient_io, features, raw_shard, stage
from .partitions import PARTITIONS_NAME, scan_raw
from .validate import latest_check_status

GROUP = "corpus"
CODE_VERSION = "corpus-1"


def corpus_shards(context, data_root: DataRoot, contract: DataContract, config) -> tuple:
    """(CorpusShard list, excluded {key: why}): every registered shard whose features exist
    and whose latest blocking checks all passed, its vectors centered by the corpus's language
    means (``open_shards``)."""
    present = set(scan_raw(data_root.raw_root).shards)
    registered = set(context.instance.get_dynamic_partitions(PARTITIONS_NAME))
    keys = sorted(registered & present)  # a shard whose raw file is gone leaves the corpus
    status = latest_check_status(context.instance, keys)
    tokens = None
    if config is not None and config.select_tokens is not None:
        tokens = functools.partial(read_tokens, token_column=config.token_column,
                                   text_column=contract.text_column or None,
                                   tokenizer=config.tokenizer)
    excluded = {}
    for key in keys:
        failed = sorted(c for c, s in status.get(key, {}).items() if s != "SUCCEEDED")
        if failed:
            excluded[key] = f"checks not passed: {', '.join(failed)}"
    opened = open_shards(data_root, [k for k in keys if k not in excluded],
                         expected_dim=contract.expected_dim,
                         quality_range=contract.quality_range, tokens=tokens)
    for key, shard in opened.items():
        if shard is None:
            excluded[key] = "no features (materialize features first)"
    return ([s for s in opened.values() if s is not None],
            {k: excluded[k] for k in keys if k in excluded})


@dg.asset(
    key="corpus_dedup",
    deps=[features, raw_shard],
    group_name=GROUP,
    kinds={"parquet", "faiss"},
    owners=OWNERS,
    tags=stage("validate"),
    code_version=CODE_VERSION,
)
@retry_transient_io
def corpus_dedup(context: dg.AssetExecutionContext, config: DedupConfig, data_root: DataRoot,
                 contract: DataContract, ray: RayCluster) -> dg.MaterializeResult:
    """Exact and semantic near-duplicates across every shard that passed its checks
    (``corpus/duplicates.parquet``: each dropped row, the row it duplicates, why, the cosine);
    the best-quality member of each group stays. The corpus selection never selects a dropped
    row."""
    engine = dedup_engine(config)
    shards_, excluded = corpus_shards(context, data_root, contract, None)
    table, stats, out = run_dedup(context, config, data_root, contract, ray, shards_, excluded)
    n_rows = int(stats.get("rows", 0))
    context.log.info(f"corpus_dedup: {table.num_rows:,} of {n_rows:,} rows are duplicates "
                     f"(threshold {config.threshold})" if config.enabled else
                     "corpus_dedup: off (every row may be selected)")
    return dg.MaterializeResult(metadata={
        "enabled": config.enabled, "threshold": config.threshold, "engine": engine,
        "rows": n_rows, "dropped": table.num_rows,
        "dropped_share": float(table.num_rows / max(1, n_rows)),
        "dropped_exact": int(stats.get("exact_dropped", 0)),
        "dropped_fuzzy": int(stats.get("fuzzy_dropped", 0)),
        "containment": config.containment,
        "near_containment": config.near_containment,
        "dropped_near": int(stats.get("near_dropped", 0)),
        "near_text_vetoed": int(stats.get("near_text_vetoed", 0)),
        "clusters": int(stats.get("clusters", 0)),
        "per_shard": dg.MetadataValue.md(dedup_md({s.key: s.n for s in shards_}, table)),
        "duplicates": dg.MetadataValue.path(out),
        "dagster/row_count": table.num_rows,
    }, data_version=dg.DataVersion(storage.sha256(out)[:16]))


def run_dedup(context, config: DedupConfig, data_root: DataRoot, contract: DataContract,
              ray: RayCluster, shards_: list, excluded: dict,
              recomputed_by: str | None = None) -> tuple:
    """The dedup over ``shards_`` (the shards present) on the configured engine, recorded in
    ``corpus/duplicates.parquet`` and ``corpus/dedup.json`` (``write_duplicates``). Returns
    (the table, the facts, the parquet's uri)."""
    engine = dedup_engine(config)
    knobs = {k: getattr(config, k) for k in type(config).model_fields}
    res = ids_txt = None
    if config.enabled and shards_:
        if engine == "ray":
            res = _dedup_on_ray(context, knobs, data_root, contract, ray, shards_)
            ids_txt = lineage_ids(res, shards_, data_root)
        else:
            res, ids_txt = dedup_local(data_root, shards_, knobs, contract.text_column)
    return write_duplicates(data_root, shards_, excluded, knobs, engine, res, ids_txt,
                            recomputed_by)


def _dedup_on_ray(context, knobs: dict, data_root: DataRoot, contract: DataContract,
                  ray: RayCluster, shards_: list):
    """``dedup_on_ray`` connected to the ``ray`` resource's cluster for the call."""
    try:
        with ray.session(context):
            context.log.info(f"corpus_dedup: deduplicating on {getattr(ray, 'name', 'Ray')}")
            return dedup_on_ray(data_root, shards_, knobs, text_column=contract.text_column,
                                expected_dim=contract.expected_dim, log=context.log.info)
    except (ConfigError, DataContractError) as exc:
        raise dg.Failure(description=f"corpus_dedup (engine ray): {exc}",
                         allow_retries=False) from exc


@dg.asset(
    key="corpus_selection",
    deps=[features, corpus_dedup],
    group_name=GROUP,
    kinds={"pytorch", "parquet"},
    owners=OWNERS,
    tags=stage("learn"),
    code_version=CODE_VERSION,
)
@retry_transient_io
def corpus_selection(context: dg.AssetExecutionContext, config: CorpusConfig,
                     data_root: DataRoot, contract: DataContract,
                     learner: MaskLearner, ray: RayCluster) -> dg.MaterializeResult:
    """The corpus's selection: the budget over every shard that passed its checks, one
    objective on the whole corpus (``corpus/selection/<version>/<key>.parquet``: shard, raw
    file, row, id, written by each shard's task; ``corpus/selection.json`` names the version)."""
    from datamask_pipeline.engine.corpus import CorpusBudget, select_corpus

    sink = SelectionFiles.new(data_root)  # published by write_selection, after the run
    try:
        budget = CorpusBudget.of(config.select_ratio, config.select_rows, config.select_tokens)
        cfg = config.learner_config()
        shards_, excluded = corpus_shards(context, data_root, contract, config)
        if not shards_:
            raise ConfigError("no shard has passed its checks yet: materialize features first"
                              + (f" (excluded: {excluded})" if excluded else ""))
        for key, why in excluded.items():
            context.log.warning(f"corpus: shard {key} left out: {why}; the budget is taken "
                                "from the other shards")
        shards_, dedup = dedup_keep(data_root, shards_, functools.partial(
            _dedup_again, context, data_root, contract, ray, shards_, excluded))
        # a killed or retried run resumes from the state it keeps on the data root
        ckpt = storage.join(data_root.root, "checkpoints", "corpus")
        warm = (last_selection(data_root, shards_, cfg.config_hash(), budget)
                if config.warm_start else None)
        engine = pick_engine(config.engine, shards_, config.mode, config.gather_max_rows)
        with learner.session() as device, \
                _tasks_on(context, engine, ray, "corpus_selection") as ex:
            result = select_corpus(
                shards_, cfg, budget, mode=config.mode, device=device,
                gather_max_rows=config.gather_max_rows, blocks=config.blocks,
                candidates=config.exchange_candidates, max_rounds=config.exchange_max_rounds,
                block_rows=config.facility_block_rows, checkpoint_dir=ckpt, warm_start=warm,
                executor=ex, sink=sink, log=context.log.info)
    except (ConfigError, DataContractError, ValueError) as exc:
        storage.remove(sink.dir, recursive=True)  # never published; the last selection stays
        raise dg.Failure(description=f"corpus_selection: {exc}", allow_retries=False) from exc

    out = write_selection(data_root, result, sink, shards_, excluded, dedup, cfg.config_hash())
    md = {
        "mode": result.mode, "route": result.route, "budget": budget.label,
        "engine": result.engine,
        "rows_corpus": result.n_input, "rows_after_dedup": result.n,
        "dedup_dropped": result.n_input - result.n,
        "dedup_threshold": dedup.get("threshold") if dedup.get("enabled", True) else "off",
        "rows_selected": result.k, "shards": len(shards_),
        "incomplete": dg.MetadataValue.bool(bool(excluded)),
        "excluded_shards": dg.MetadataValue.json(excluded),
        "whole_corpus_scores": dg.MetadataValue.md(scores_md(result)),
        "scored_by": result.scored_by or "not computed",
        "shares": dg.MetadataValue.md(shares_md(result.counts, {s.key: s.n for s in shards_},
                                                excluded)),
        "selection": dg.MetadataValue.path(sink.dir),
        "selection_facts": dg.MetadataValue.path(out),
        "notes": dg.MetadataValue.md("\n".join(f"- {n}" for n in result.notes) or "-"),
        "seconds": round(result.timings.get("total_s", 0.0), 3),
        "dagster/row_count": result.k,
    }
    if result.scores:
        md["f_selection"] = result.scores["selection"]["f"]
    if result.rounds:
        md["exchange_rounds"] = len(result.rounds)
        md["exchange_converged"] = bool(result.converged)
        md["bytes_exchanged"] = int(sum(r["bytes_exchanged"] for r in result.rounds))
    if result.tokens:
        md["tokens"] = dg.MetadataValue.json(result.tokens)
    return dg.MaterializeResult(metadata=md, data_version=dg.DataVersion(selection_digest(result.files)))


def _dedup_again(context, data_root: DataRoot, contract: DataContract, ray: RayCluster,
                 shards_: list, excluded: dict, stale: list, gone: list) -> dict:
    """The dedup run again over the shards present, with the config of its last run (its
    keep decisions were made over other shards): a removed keeper frees its duplicates."""
    config = DedupConfig(**(read_facts(data_root).get("config") or {}))
    context.log.warning(f"corpus_selection: the dedup saw shard(s) {gone[:5]} that are gone and "
                        f"not {stale[:5]} as they are now: deduplicating again over the "
                        f"{len(shards_)} shard(s) present")
    return run_dedup(context, config, data_root, contract, ray, shards_, excluded,
                     recomputed_by="corpus_selection")[1]


@contextlib.contextmanager
def _tasks_on(context, engine: str, ray: RayCluster, step: str):
    """The executor of a step's per-shard tasks: ``ray``, Ray tasks on the ``ray`` resource's
    cluster, connected for the block; ``local``, this process."""
    from datamask_pipeline.engine.corpus.executor import InProcess, RayTasks

    if engine == "local":
        yield InProcess()
        return
    with ray.session(context):
        ex = RayTasks()
        context.log.info(f"{step}: per-shard passes on {ex.name}")
        yield ex


@dg.asset(
    key="corpus_subset",
    deps=[corpus_selection, raw_shard],
    group_name=GROUP,
    kinds={"parquet", "pyarrow"},
    owners=OWNERS,
    tags=stage("select"),
    code_version=CODE_VERSION,
)
@retry_transient_io
def corpus_subset(context: dg.AssetExecutionContext, data_root: DataRoot,
                  contract: DataContract, ray: RayCluster) -> dg.MaterializeResult:
    """Each shard's selected raw rows, every column unchanged (``selected/<key>.parquet``),
    one task per shard where the selection ran (Ray tasks when it ran on Ray). Only shards
    whose selection or raw file changed are rewritten; files of shards that left the corpus
    are removed."""
    from datamask_pipeline.engine.corpus import CorpusBudget
    from datamask_pipeline.reporting.corpus_selection_report import render_page

    summary = selection_facts(data_root)
    if summary is None:
        raise dg.Failure(description=f"corpus_subset: {data_root.corpus_file('selection.json')}"
                                     " missing: materialize corpus_selection first",
                         allow_retries=False)
    try:
        # where the selection ran (its facts name the executor)
        engine = "ray" if str(summary.get("engine", "")).startswith("Ray") else "local"
        with _tasks_on(context, engine, ray, "corpus_subset") as ex:
            done = write_subsets(data_root, contract.id_column, ex, log=context.log.info)
            sources = source_shares(data_root, done.keys, executor=ex)
    except SubsetError as exc:
        raise dg.Failure(description=f"corpus_subset: {exc}", allow_retries=False) from exc
    report = data_root.corpus_file("report.html")
    budget = CorpusBudget(summary["budget"]["kind"], summary["budget"]["value"]).label
    pairs = duplicate_sample(data_root, contract.text_column, set(done.keys))
    storage.atomic_write_bytes(report, render_page(summary, budget, sources, pairs).encode())
    selected = int(summary["selected_rows"])
    return dg.MaterializeResult(metadata={
        "report": dg.MetadataValue.path(report),
        "shards": len(done.keys), "rewritten_shards": dg.MetadataValue.json(done.rewritten),
        "removed_shards": dg.MetadataValue.json(done.removed), "rows_written": done.rows_written,
        "rows_selected": selected,
        "source_shares": dg.MetadataValue.md(sources_md(sources)) if sources else "no source column",
        "selected_root": dg.MetadataValue.path(data_root.corpus_selected_root),
        "dagster/row_count": selected,
    })

