"""The corpus stage: one budget and one objective over every shard (``engine.corpus``).

``corpus_selection`` reads the features of every registered shard whose blocking checks
passed, selects the corpus budget with ``select_corpus`` and publishes
``corpus/selection.parquet`` (one row per selected row: shard, raw file, row number, id) and
``corpus/selection.json`` (the run's facts). ``corpus_subset`` writes each shard's selected raw
rows to ``selected/<key>.parquet``, rewriting only the shards whose selection changed, and
removes the files of shards that left the corpus.
"""


import contextlib
import functools
import hashlib
import importlib.util
import json
from typing import Optional

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pydantic import Field, create_model

from datamask_pipeline.engine import storage
from datamask_pipeline.engine.corpus.dedup import (DEFAULT_CONTAINMENT, DEFAULT_THRESHOLD,
                                                    NEAR_MIN_CONTAINMENT)
from datamask_pipeline.engine.config import ConfigError
from datamask_pipeline.engine.data import DataContractError, raw_row_numbers
from resources.contract import DataContract
from resources.learner import MaskLearner
from resources.ray import RayCluster
from resources.storage import DataRoot

from .ingest import (EMBEDDING, ID, OWNERS, QUALITY, retry_transient_io, features, raw_shard,
                     stage)
from .learn import MaskConfig
from .partitions import PARTITIONS_NAME
from .select import raw_schema

GROUP = "corpus"
CODE_VERSION = "corpus-1"


CorpusConfig = create_model(
    "CorpusConfig", __base__=MaskConfig,
    __doc__="The corpus budget and mode, and the method's knobs (select_ratio is the corpus's).",
    mode=(str, Field(default="auto", description=(
        "auto: one selection over the whole corpus while it fits (gather_max_rows and memory), "
        "else exchange (Pair_simi, DiSF: exchange rounds; Facility: greedy in k-means blocks, one "
        "gain threshold); gather; exchange; per_shard: "
        "each shard alone with its proportional share; random_blocks: the corpus re-cut into "
        "random blocks by a keyed hash of the id (the paper's blocks)."))),
    select_rows=(Optional[int], Field(default=None, description=(
        "Corpus budget as a number of rows (instead of select_ratio)."))),
    select_tokens=(Optional[int], Field(default=None, description=(
        "Corpus budget as a number of tokens (instead of select_ratio): met within one "
        "document. Token counts come from token_column, else from the text column with "
        "the tokenizer."))),
    token_column=(Optional[str], Field(default=None, description=(
        "Raw column holding each row's token count (for select_tokens)."))),
    tokenizer=(str, Field(default="wordllama", description=(
        "How tokens are counted from the text when there is no token_column: wordllama (the "
        "subword tokenizer shipped with the default embedding model) or whitespace (words)."))),
    blocks=(Optional[int], Field(default=None, description=(
        "random_blocks: number of blocks (default: as many as shards)."))),
    gather_max_rows=(int, Field(default=1_000_000, description=(
        "auto: the largest corpus selected in one piece (above it: exchange rounds)."))),
    exchange_candidates=(int, Field(default=4096, description=(
        "exchange: candidates per shard and round (each way)."))),
    exchange_max_rounds=(int, Field(default=50, description="exchange: most rounds.")),
    facility_block_rows=(int, Field(default=8192, ge=64, description=(
        "exchange for Facility: the most rows in one block of the corpus-wide k-means (greedy "
        "per block, one gain threshold); a task holds its square in floats."))),
    engine=(str, Field(default="auto", description=(
        "Where the per_shard and exchange passes run, one task per shard: auto (Ray tasks when "
        "the corpus is past gather_max_rows and Ray is installed, else this step's process), "
        "local (this step's process), ray (Ray tasks on the `ray` resource's cluster: env "
        "DATAMASK_RAY_ADDRESS; unset: a local Ray with one worker per core). gather and "
        "random_blocks hold the corpus in this step's process."))),
    warm_start=(bool, Field(default=True, description=(
        "exchange: start from the last selection (same knobs and budget) for the shards whose "
        "features did not change, instead of selecting every shard again; new and rewritten "
        "shards' rows enter through the gains and the rounds."))),
)


def _budget(config):
    from datamask_pipeline.engine.corpus import CorpusBudget

    return CorpusBudget.of(config.select_ratio, config.select_rows, config.select_tokens)


def _tokens(raw_uri: str, config, text_column: str | None) -> np.ndarray:
    if config.token_column:
        col = storage.read_column(raw_uri, config.token_column)
        if col is None:
            raise DataContractError(raw_uri, "column present", column=config.token_column,
                                    detail=f"token_column; available columns: "
                                           f"{raw_schema(raw_uri).names}")
        if not pa.types.is_integer(col.type) or col.null_count:
            raise DataContractError(raw_uri, "token counts are non-null integers",
                                    column=config.token_column)
        return col.to_numpy().astype(np.int64)
    text = storage.read_column(raw_uri, text_column) if text_column else None
    if text is None:
        raise DataContractError(raw_uri, "column present", column=text_column or "text",
                                detail="select_tokens without token_column counts tokens "
                                       f"from the text; available columns: "
                                       f"{raw_schema(raw_uri).names}")
    from datamask_pipeline.engine.corpus.tokens import count_tokens

    return count_tokens(text, config.tokenizer)


def features_loader(uri: str, contract: DataContract):
    """A shard's features reader that pickles (engine functions and plain values only), so
    a Ray task can read the shard where it runs; re-checked against the contract as
    ``read_features`` does."""
    from datamask_pipeline.engine.data import Columns, read_shard

    return functools.partial(read_shard, uri,
                             columns=Columns(id=ID, quality=(QUALITY,), embedding=EMBEDDING),
                             expected_dim=contract.expected_dim,
                             quality_range=contract.quality_range)


def corpus_shards(context, data_root: DataRoot, contract: DataContract, config) -> tuple:
    """(CorpusShard list, excluded {key: why}): every registered shard whose features exist
    and whose latest blocking checks all passed."""
    from datamask_pipeline.engine.corpus import CorpusShard

    from .validate import latest_check_status

    from .partitions import scan_raw

    present = set(scan_raw(data_root.raw_root).shards)
    registered = set(context.instance.get_dynamic_partitions(PARTITIONS_NAME))
    keys = sorted(registered & present)  # a shard whose raw file is gone leaves the corpus
    status = latest_check_status(context.instance, keys)
    out, excluded = [], {}
    for key in keys:
        failed = sorted(c for c, s in status.get(key, {}).items() if s != "SUCCEEDED")
        uri = data_root.features(key)
        if failed:
            excluded[key] = f"checks not passed: {', '.join(failed)}"
            continue
        if not storage.exists(uri):
            excluded[key] = "no features (materialize features first)"
            continue
        fs, path = storage.resolve(uri)
        with fs.open_input_file(path) as fh:
            n = pq.ParquetFile(fh).metadata.num_rows
        tokens = None
        if config is not None and config.select_tokens is not None:
            tokens = _tokens(data_root.raw_shard(key), config, contract.text_column or None)
        info = fs.get_file_info(path)
        out.append(CorpusShard(key=key, n=int(n), tokens=tokens,
                               version=f"{info.size}:{info.mtime_ns}",
                               load=features_loader(uri, contract)))
    return out, excluded


def selection_table(result, shards, data_root: DataRoot) -> pa.Table:
    """One row per selected row: partition_key, raw_uri, row (in the features: the raw
    file's row unless ingestion quarantined rows, see ``engine.data.raw_row_numbers``), id (as
    text)."""
    cols = {"partition_key": [], "raw_uri": [], "row": [], "id": []}
    for s in shards:
        rows = result.selected[s.key]
        if not rows.size:
            continue
        ids = storage.read_table(data_root.features(s.key), [ID]).column(ID).take(pa.array(rows))
        cols["partition_key"] += [s.key] * rows.size
        cols["raw_uri"] += [data_root.raw_shard(s.key)] * rows.size
        cols["row"].append(rows.astype(np.int64))
        cols["id"].append(pc.cast(ids, pa.string()).to_numpy(zero_copy_only=False))
    return pa.table({
        "partition_key": pa.array(cols["partition_key"], pa.string()),
        "raw_uri": pa.array(cols["raw_uri"], pa.string()),
        "row": pa.array(np.concatenate(cols["row"]) if cols["row"] else [], pa.int64()),
        "id": pa.array(np.concatenate(cols["id"]) if cols["id"] else [], pa.string()),
    })


def _scores_md(result) -> str:
    if not result.scores:
        return "(not computed: " + "; ".join(result.notes) + ")"
    lines = [f"| selection | f (λ={result.lamb:g}, {result.term}) | f_qua | f_div |",
             "|---|---:|---:|---:|"]
    label = {"selection": f"corpus {result.mode} ({result.route})"}
    for name, sc in result.scores.items():
        lines.append(f"| {label.get(name, name)} | {sc['f']:.6g} | {sc['f_qua']:.6g} | "
                     f"{sc['f_div']:.6g} |")
    return "\n".join(lines)


def _shares_md(counts: dict, sizes: dict, excluded: dict) -> str:
    total = max(1, sum(counts.values()))
    lines = ["| shard | rows | selected | kept | share of the selection |", "|---|---:|---:|---:|---:|"]
    for key in sorted(sizes):
        c = counts.get(key, 0)
        lines.append(f"| {key} | {sizes[key]:,} | {c:,} | {c / max(1, sizes[key]):.1%} | "
                     f"{c / total:.1%} |")
    for key, why in sorted(excluded.items()):
        lines.append(f"| {key} | excluded | - | - | {why} |")
    return "\n".join(lines)


class DedupConfig(dg.Config):
    """Deduplication across the corpus before the selection."""

    enabled: bool = Field(default=True, description=(
        "Drop duplicates before selecting (false: every row may be selected)."))
    exact: bool = Field(default=True, description=(
        "Exact duplicates: equal text after lower-casing and collapsing whitespace (needs the "
        "raw text column; skipped without one)."))
    fuzzy: bool = Field(default=True, description=(
        "Fuzzy text duplicates: MinHash-LSH over word 3-grams, then a pair whose smaller text's "
        "3-grams are contained in the other's at >= containment (needs the raw text column)."))
    containment: float = Field(default=DEFAULT_CONTAINMENT, gt=0.0, le=1.0, description=(
        "Share of the smaller text's word 3-grams found in the other text for a fuzzy duplicate."))
    near: bool = Field(default=True, description=(
        "Semantic near-duplicates: rows clustered over the whole corpus, then pairs inside a "
        "cluster at cosine >= threshold."))
    threshold: float = Field(default=DEFAULT_THRESHOLD, gt=0.0, le=1.0, description=(
        "Cosine at or above which two rows are near-duplicates (the worse-ranked one is dropped)."))
    near_containment: float = Field(default=NEAR_MIN_CONTAINMENT, ge=0.0, le=1.0, description=(
        "With texts, a near pair is a duplicate only when the smaller text's word 3-grams "
        "(common lines left out) are also found in the other's at >= this: pages on one "
        "template with different content stay (0: cosine alone)."))
    rows_per_cluster: int = Field(default=1000, ge=2, description=(
        "Mean cluster size of the corpus-wide k-means (clusters = rows / this)."))
    engine: str = Field(default="local", description=(
        "local: in this step's process, every shard's rows in memory; ray: the corpus-wide "
        "steps (text-key groups, boilerplate counts, LSH bands, clusters) as a Ray Data "
        "pipeline on the `ray` resource's cluster (env DATAMASK_RAY_ADDRESS; unset: a local "
        "Ray), with the same result. Needs the ray extra."))
    ray_partitions: Optional[int] = Field(default=None, ge=1, description=(
        "engine ray: partitions of each Ray Data groupby (unset: Ray's default)."))


DEDUP_ENGINES = ("local", "ray")


def _dedup_engine(config: DedupConfig) -> str:
    engine = config.engine.strip().lower()
    if engine not in DEDUP_ENGINES:
        raise dg.Failure(description=(
            f"corpus_dedup: engine must be one of {list(DEDUP_ENGINES)} "
            f"(config key corpus_dedup.config.engine), got {config.engine!r}"),
            allow_retries=False)
    return engine


def _raw_texts(raw_uri: str, column: str | None, features_uri: str | None = None):
    """The raw text column, at the features' rows (their raw row numbers when ingestion
    quarantined rows: ``engine.data.raw_row_numbers``)."""
    col = storage.read_column(raw_uri, column) if column else None
    if col is None:
        return None
    rows = raw_row_numbers(features_uri) if features_uri is not None else None
    col = col.combine_chunks()
    return col if rows is None else col.take(pa.array(rows))


DUPLICATES = "duplicates.parquet"


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
    engine = _dedup_engine(config)
    shards_, excluded = corpus_shards(context, data_root, contract, None)
    table, stats, out = run_dedup(context, config, data_root, contract, ray, shards_, excluded)
    per_shard = {}
    for key, reason in zip(table.column("partition_key").to_pylist(),
                           table.column("reason").to_pylist()):
        per_shard.setdefault(key, {"exact": 0, "fuzzy": 0, "near": 0})[reason] += 1
    n_rows = int(stats.get("rows", 0))
    md = ["| shard | rows | exact | fuzzy | near | dropped |", "|---|---:|---:|---:|---:|---:|"]
    for s in shards_:
        e = per_shard.get(s.key, {"exact": 0, "fuzzy": 0, "near": 0})
        md.append(f"| {s.key} | {s.n:,} | {e['exact']:,} | {e['fuzzy']:,} | {e['near']:,} | "
                  f"{sum(e.values()) / max(1, s.n):.1%} |")
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
        "per_shard": dg.MetadataValue.md("\n".join(md)),
        "duplicates": dg.MetadataValue.path(out),
        "dagster/row_count": table.num_rows,
    }, data_version=dg.DataVersion(storage.sha256(out)[:16]))


DUPLICATES_SCHEMA = pa.schema([
    ("partition_key", pa.string()), ("row", pa.int64()), ("id", pa.string()),
    ("dup_of_partition_key", pa.string()), ("dup_of_row", pa.int64()),
    ("dup_of_id", pa.string()), ("kept_partition_key", pa.string()), ("kept_row", pa.int64()),
    ("kept_id", pa.string()), ("reason", pa.string()), ("kind", pa.string()),
    ("cosine", pa.float64()), ("containment", pa.float64())])


def run_dedup(context, config: DedupConfig, data_root: DataRoot, contract: DataContract,
              ray: RayCluster, shards_: list, excluded: dict,
              recomputed_by: str | None = None) -> tuple:
    """The dedup over ``shards_`` (the shards present), written to ``corpus/duplicates.parquet``
    (each dropped row: the row it duplicates, the row kept for it, its kind and evidence) and
    ``corpus/dedup.json`` (the facts, the config, each shard's version). Returns (the table,
    the facts, the parquet's uri)."""
    engine = _dedup_engine(config)
    stats = {"enabled": config.enabled, "threshold": config.threshold, "rows": 0, "dropped": 0,
             "engine": engine}
    cols = {f.name: [] for f in DUPLICATES_SCHEMA}
    if config.enabled and shards_:
        if engine == "ray":
            res = _dedup_on_ray(context, config, data_root, contract, ray, shards_)
            ids_txt = _lineage_ids(res, shards_, data_root)
        else:
            res, ids_txt = _dedup_local(config, data_root, contract, shards_)
        for d in res.dropped:
            for pre, (sh, row) in (("", (d["shard"], d["row"])),
                                   ("dup_of_", (d["dup_of_shard"], d["dup_of_row"])),
                                   ("kept_", (d["kept_shard"], d["kept_row"]))):
                cols[pre + "partition_key"].append(shards_[sh].key)
                cols[pre + "row"].append(row)
                cols[pre + "id"].append(ids_txt[sh][row])
            for c in ("reason", "kind", "cosine", "containment"):
                cols[c].append(d[c])
        stats.update(res.stats)
    table = pa.table({f.name: pa.array(cols[f.name], f.type) for f in DUPLICATES_SCHEMA},
                     schema=DUPLICATES_SCHEMA)
    storage.makedirs(data_root.corpus_dir())
    out = storage.join(data_root.corpus_dir(), DUPLICATES)
    storage.atomic_write_table(table, out)
    stats.update(versions={s.key: s.version for s in shards_}, excluded=excluded,
                 config={k: getattr(config, k) for k in type(config).model_fields})
    if recomputed_by:
        stats["recomputed_by"] = recomputed_by
    storage.atomic_write_bytes(storage.join(data_root.corpus_dir(), "dedup.json"),
                               json.dumps(stats, indent=1, default=float).encode())
    return table, stats, out


def _dedup_local(config: DedupConfig, data_root: DataRoot, contract: DataContract,
                 shards_: list):
    """``deduplicate`` in this process, every shard's rows in memory (the texts only when
    every raw file has the text column). Returns (the result, each shard's ids as text)."""
    from datamask_pipeline.engine.corpus.dedup import deduplicate

    parts = [s.load() for s in shards_]
    # ids as text (shards may differ in id type): dedup's tie-break and the lineage
    ids_txt = [pc.cast(pa.array(p.ids), pa.string()).to_numpy(zero_copy_only=False)
               for p in parts]
    texts = None
    if config.exact or config.fuzzy or (config.near and config.near_containment > 0):
        got = [_raw_texts(data_root.raw_shard(s.key), contract.text_column,
                          data_root.features(s.key)) for s in shards_]
        if all(t is not None for t in got):
            texts = pa.chunked_array(got).combine_chunks() if len(got) > 1 else got[0]
    res = deduplicate(
        np.concatenate([p.embeddings for p in parts]),
        np.concatenate([np.asarray(p.quality, dtype=np.float64) for p in parts]),
        np.concatenate(ids_txt),
        np.concatenate([np.full(p.n, i) for i, p in enumerate(parts)]),
        np.concatenate([np.arange(p.n) for p in parts]), texts, exact=config.exact,
        fuzzy=config.fuzzy, containment=config.containment, near=config.near,
        threshold=config.threshold, rows_per_cluster=config.rows_per_cluster,
        near_containment=config.near_containment)
    return res, ids_txt


def _dedup_on_ray(context, config: DedupConfig, data_root: DataRoot, contract: DataContract,
                  ray: RayCluster, shards_: list):
    """``deduplicate_ray`` on the ``ray`` resource's cluster: the shards' files are read by
    Ray tasks (the texts only when every raw file has the text column, as the local engine)."""
    from datamask_pipeline.engine.corpus.dedup_ray import ShardSource, deduplicate_ray

    column = contract.text_column or None
    texts = bool(column) and (config.exact or config.fuzzy or (
        config.near and config.near_containment > 0)) and all(
        column in raw_schema(data_root.raw_shard(s.key)).names for s in shards_)
    sources = [ShardSource(features=data_root.features(s.key),
                           raw=data_root.raw_shard(s.key) if texts else None,
                           text_column=column if texts else None) for s in shards_]
    try:
        with ray.session(context):
            context.log.info(f"corpus_dedup: deduplicating on {getattr(ray, 'name', 'Ray')}")
            return deduplicate_ray(
                sources, exact=config.exact, fuzzy=config.fuzzy, near=config.near,
                threshold=config.threshold, containment=config.containment,
                rows_per_cluster=config.rows_per_cluster, id_column=ID, quality_column=QUALITY,
                embedding_column=EMBEDDING, expected_dim=contract.expected_dim,
                shuffle_partitions=config.ray_partitions,
                near_containment=config.near_containment, log=context.log.info)
    except (ConfigError, DataContractError) as exc:
        raise dg.Failure(description=f"corpus_dedup (engine ray): {exc}",
                         allow_retries=False) from exc


def _lineage_ids(res, shards_: list, data_root: DataRoot) -> dict:
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
        col = storage.read_table(data_root.features(shards_[i].key), [ID]).column(ID)
        got = pc.cast(col.take(pa.array(rows)), pa.string()).to_pylist()
        out[i] = dict(zip(rows, got))
    return out


def last_selection(data_root: DataRoot, shards_: list, cfg, budget) -> dict | None:
    """{shard: selected rows} of the last corpus selection, for the shards whose features are
    unchanged since, when it was made with the same knobs and budget; None otherwise."""
    facts_uri = storage.join(data_root.corpus_dir(), "selection.json")
    sel_uri = storage.join(data_root.corpus_dir(), "selection.parquet")
    if not (storage.exists(facts_uri) and storage.exists(sel_uri)):
        return None
    facts = json.loads(storage.read_bytes(facts_uri))
    if (facts.get("config_hash") != cfg.config_hash()
            or facts.get("budget") != {"kind": budget.kind, "value": budget.value}):
        return None
    versions = facts.get("versions", {})
    same = {s.key for s in shards_ if versions.get(s.key) == s.version}
    t = storage.read_table(sel_uri, ["partition_key", "row"])
    keys = t.column("partition_key").to_numpy(zero_copy_only=False)
    rows = t.column("row").to_numpy()
    return {k: rows[keys == k] for k in same}


def dedup_keep(data_root: DataRoot, shards_: list, recompute=None) -> tuple:
    """Each shard's keep mask from ``corpus/duplicates.parquet`` (None where no row is
    dropped), and the dedup facts. The keep decisions hold only for the shards the dedup saw:
    when a shard it saw is gone (its kept rows may have been the reason others were dropped)
    or one is new or re-ingested, ``recompute()`` runs the dedup again over the shards present
    and returns its facts; without ``recompute`` that fails."""
    out = storage.join(data_root.corpus_dir(), DUPLICATES)
    facts_uri = storage.join(data_root.corpus_dir(), "dedup.json")
    if not storage.exists(out) or not storage.exists(facts_uri):
        raise ConfigError("no corpus/duplicates.parquet: materialize corpus_dedup first "
                          "(corpus_job runs it; its config enabled=false turns it off)")
    facts = json.loads(storage.read_bytes(facts_uri))
    if facts.get("enabled", True):
        seen = facts.get("versions", {})
        stale = [s.key for s in shards_ if seen.get(s.key) != s.version]
        gone = sorted(set(seen) - {s.key for s in shards_})
        if stale or gone:
            if recompute is None:
                raise ConfigError(f"corpus_dedup ran before shard(s) {stale[:5]} were "
                                  f"(re)ingested or over shard(s) {gone[:5]} that are gone: "
                                  "materialize corpus_dedup again (corpus_job runs both)")
            facts = recompute(stale, gone)
    counts = pc.value_counts(storage.read_table(out, ["partition_key"]).column("partition_key"))
    dropped = {c["values"]: int(c["counts"]) for c in counts.to_pylist()}
    for s in shards_:
        if dropped.get(s.key):
            # the mask is read by the shard's own task, not held here for every shard
            s.keep = functools.partial(keep_mask, out, s.key, s.n)
            s.n_kept = s.n - dropped[s.key]
    return shards_, facts


def keep_mask(duplicates_uri: str, key: str, n: int) -> np.ndarray:
    """Shard ``key``'s keep mask: its rows not named in ``duplicates.parquet``."""
    import pyarrow.dataset as ds

    fs, path = storage.resolve(duplicates_uri)
    t = ds.dataset(path, filesystem=fs, format="parquet").to_table(
        columns=["row"], filter=ds.field("partition_key") == key)
    keep = np.ones(n, dtype=bool)
    keep[t.column("row").to_numpy()] = False
    return keep


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
    objective on the whole corpus (``corpus/selection.parquet``: shard, raw file, row, id)."""
    from datamask_pipeline.engine.corpus import select_corpus

    try:
        budget = _budget(config)
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
        warm = last_selection(data_root, shards_, cfg, budget) if config.warm_start else None
        with learner.session() as device, _executor(context, config, ray, shards_) as ex:
            result = select_corpus(
                shards_, cfg, budget, mode=config.mode, device=device,
                gather_max_rows=config.gather_max_rows, blocks=config.blocks,
                candidates=config.exchange_candidates, max_rounds=config.exchange_max_rounds,
                block_rows=config.facility_block_rows, checkpoint_dir=ckpt, warm_start=warm, executor=ex, log=context.log.info)
    except (ConfigError, DataContractError, ValueError) as exc:
        raise dg.Failure(description=f"corpus_selection: {exc}", allow_retries=False) from exc

    table = selection_table(result, shards_, data_root)
    out = storage.join(data_root.corpus_dir(), "selection.parquet")
    storage.makedirs(data_root.corpus_dir())
    storage.atomic_write_table(table, out)
    summary = result.summary()
    summary["excluded"] = excluded
    summary["dedup"] = {k: dedup.get(k) for k in ("enabled", "threshold", "containment", "dropped",
                                                  "exact_dropped", "fuzzy_dropped", "near_dropped",
                                                  "rows")}
    summary["sizes"] = {s.key: s.n for s in shards_}  # input rows of each shard
    summary["versions"] = {s.key: s.version for s in shards_}
    summary["config_hash"] = cfg.config_hash()
    storage.atomic_write_bytes(storage.join(data_root.corpus_dir(), "selection.json"),
                               json.dumps(summary, indent=1, default=float).encode())
    sizes = {s.key: s.n for s in shards_}
    md = {
        "mode": result.mode, "route": result.route, "budget": budget.label,
        "engine": result.engine,
        "rows_corpus": result.n_input, "rows_after_dedup": result.n,
        "dedup_dropped": result.n_input - result.n,
        "dedup_threshold": dedup.get("threshold") if dedup.get("enabled", True) else "off",
        "rows_selected": result.k, "shards": len(shards_),
        "incomplete": dg.MetadataValue.bool(bool(excluded)),
        "excluded_shards": dg.MetadataValue.json(excluded),
        "whole_corpus_scores": dg.MetadataValue.md(_scores_md(result)),
        "scored_by": result.scored_by or "not computed",
        "shares": dg.MetadataValue.md(_shares_md(result.counts, sizes, excluded)),
        "selection": dg.MetadataValue.path(out),
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
    return dg.MaterializeResult(metadata=md, data_version=dg.DataVersion(storage.sha256(out)[:16]))


def _dedup_again(context, data_root: DataRoot, contract: DataContract, ray: RayCluster,
                 shards_: list, excluded: dict, stale: list, gone: list) -> dict:
    """The dedup run again over the shards present, with the config of its last run (its
    keep decisions were made over other shards): a removed keeper frees its duplicates."""
    facts = json.loads(storage.read_bytes(storage.join(data_root.corpus_dir(), "dedup.json")))
    config = DedupConfig(**(facts.get("config") or {}))
    context.log.warning(f"corpus_selection: the dedup saw shard(s) {gone[:5]} that are gone and "
                        f"not {stale[:5]} as they are now: deduplicating again over the "
                        f"{len(shards_)} shard(s) present")
    return run_dedup(context, config, data_root, contract, ray, shards_, excluded,
                     recomputed_by="corpus_selection")[1]


@contextlib.contextmanager
def _executor(context, config, ray: RayCluster, shards_: list):
    """The executor of the per-shard passes: Ray tasks on the ``ray`` resource's cluster
    (connected for the block) where config ``engine`` asks for it, or (``auto``) where the
    corpus is past ``gather_max_rows`` and Ray is installed; else this process."""
    from datamask_pipeline.engine.corpus.executor import ENGINES, InProcess, RayTasks

    engine = config.engine.strip().lower()
    if engine not in ENGINES:
        raise ConfigError(f"corpus_selection: engine must be one of {list(ENGINES)} "
                          f"(config key corpus_selection.config.engine), got {config.engine!r}")
    rows = sum(s.n_kept if s.n_kept is not None else s.n for s in shards_)
    if engine == "auto":
        big = rows > config.gather_max_rows and config.mode not in ("gather", "random_blocks")
        engine = "ray" if big and importlib.util.find_spec("ray") is not None else "local"
    if engine == "local":
        yield InProcess()
        return
    with ray.session(context):
        ex = RayTasks()
        context.log.info(f"corpus_selection: per-shard passes on {ex.name}")
        yield ex


def _shard_digest(rows: np.ndarray, raw_sig: str) -> str:
    return hashlib.sha256(np.asarray(rows, dtype=np.int64).tobytes() + raw_sig.encode()).hexdigest()[:16]


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
                  contract: DataContract) -> dg.MaterializeResult:
    """Each shard's selected raw rows, every column unchanged (``selected/<key>.parquet``).
    Only shards whose selection or raw file changed are rewritten; files of shards that left
    the corpus are removed."""
    sel_uri = storage.join(data_root.corpus_dir(), "selection.parquet")
    man_uri = storage.join(data_root.corpus_dir(), "subsets.json")
    if not storage.exists(sel_uri):
        raise dg.Failure(description=f"corpus_subset: {sel_uri} missing: materialize "
                                     "corpus_selection first", allow_retries=False)
    table = storage.read_table(sel_uri)
    summary = json.loads(storage.read_bytes(storage.join(data_root.corpus_dir(), "selection.json")))
    manifest = json.loads(storage.read_bytes(man_uri)) if storage.exists(man_uri) else {}
    keys = sorted(summary["sizes"])
    part = table.column("partition_key").to_numpy(zero_copy_only=False)
    changed, written_rows, new_manifest = [], 0, {}
    for key in keys:
        m = part == key
        ids = table.column("id").filter(pa.array(m)).to_pylist()
        rows = table.column("row").filter(pa.array(m)).to_numpy()
        # the selection's rows are the features' rows: the raw file's rows differ once
        # ingestion quarantined some (the digest is of the raw rows, so a change of what was
        # quarantined rewrites the subset)
        rows = raw_row_numbers(data_root.features(key), rows)
        raw_uri = data_root.raw_shard(key)
        fs_r, p_r = storage.resolve(raw_uri)
        info = fs_r.get_file_info(p_r)
        digest = _shard_digest(rows, f"{info.size}:{info.mtime_ns}")
        out = data_root.corpus_selected(key)
        new_manifest[key] = digest
        if manifest.get(key) == digest and storage.exists(out):
            continue
        try:
            raw_ids = _raw_ids_at(raw_uri, contract.id_column, rows)
            w = storage.write_selected_rows(raw_uri, out, raw_ids, contract.id_column)
        except (DataContractError, storage.StorageError) as exc:
            raise dg.Failure(description=f"corpus_subset: shard {key!r}: cannot write the "
                                         f"selected rows: {exc}", allow_retries=False) from exc
        if w["rows"] != len(ids):  # pragma: no cover - write_selected_rows checks every id
            raise dg.Failure(description=f"corpus_subset: shard {key!r}: wrote {w['rows']} rows, "
                                         f"{len(ids)} selected", allow_retries=False)
        changed.append(key)
        written_rows += w["rows"]
        context.log.info(f"corpus_subset: {key}: {w['rows']:,} rows -> {out}")
    removed = []
    if storage.exists(data_root.corpus_selected_root):
        for uri in storage.list_files(data_root.corpus_selected_root, suffix=".parquet"):
            key = storage.partition_key_for(uri)
            if key not in new_manifest:
                storage.remove(uri)
                removed.append(key)
    storage.atomic_write_bytes(man_uri, json.dumps(new_manifest, indent=1, sort_keys=True).encode())
    sources = source_shares(data_root, keys)
    from datamask_pipeline.engine.corpus import CorpusBudget
    from datamask_pipeline.reporting.corpus_selection_report import render_page

    report = storage.join(data_root.corpus_dir(), "report.html")
    budget = CorpusBudget(summary["budget"]["kind"], summary["budget"]["value"]).label
    pairs = duplicate_sample(data_root, contract, set(keys))
    storage.atomic_write_bytes(report, render_page(summary, budget, sources, pairs).encode())
    return dg.MaterializeResult(metadata={
        "report": dg.MetadataValue.path(report),
        "shards": len(keys), "rewritten_shards": dg.MetadataValue.json(changed),
        "removed_shards": dg.MetadataValue.json(removed), "rows_written": written_rows,
        "rows_selected": int(table.num_rows),
        "source_shares": dg.MetadataValue.md(_sources_md(sources)) if sources else "no source column",
        "selected_root": dg.MetadataValue.path(data_root.corpus_selected_root),
        "dagster/row_count": int(table.num_rows),
    })


PAIRS_PER_KIND = 4


def duplicate_sample(data_root: DataRoot, contract: DataContract, keys: set,
                     per_kind: int = PAIRS_PER_KIND, seed: int = 0) -> list:
    """A seeded sample of ``corpus/duplicates.parquet`` (up to ``per_kind`` dropped rows of
    each kind, whose shards are all in ``keys``) with both texts, for the report's side-by-side
    table; [] without a duplicates file or a text column."""
    uri = storage.join(data_root.corpus_dir(), DUPLICATES)
    column = contract.text_column or None
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
        col = storage.read_column(data_root.raw_shard(key), column)
        if col is None:
            return []
        raw = raw_row_numbers(data_root.features(key), np.asarray(rs, dtype=np.int64))
        got = col.take(pa.array(np.asarray(raw, dtype=np.int64))).to_pylist()
        texts.update({(key, r): v for r, v in zip(rs, got)})
    return [{"kind": d["kind"], "containment": d["containment"], "cosine": d["cosine"],
             "dropped": f"{d['partition_key']} row {d['row']} (id {d['id']})",
             "kept": f"{d['dup_of_partition_key']} row {d['dup_of_row']} (id {d['dup_of_id']})",
             "dropped_text": texts[(d["partition_key"], d["row"])],
             "kept_text": texts[(d["dup_of_partition_key"], d["dup_of_row"])]} for d in picked]


def _raw_ids_at(raw_uri: str, id_column: str, rows: np.ndarray):
    """The raw ids at the given raw row numbers."""
    col = storage.read_table(raw_uri, [id_column]).column(id_column)
    return col.take(pa.array(np.asarray(rows, dtype=np.int64))).to_pylist()


def _counts(uri: str, column: str):
    col = storage.read_column(uri, column)
    if col is None:
        return None
    return {item["values"]: item["counts"] for item in pc.value_counts(col).to_pylist()}


def source_shares(data_root: DataRoot, keys, column: str = "source") -> dict | None:
    """{source: (rows in the corpus, rows selected)}; None when a shard has no such column."""
    out: dict = {}
    for key in keys:
        raw = _counts(data_root.raw_shard(key), column)
        sel_uri = data_root.corpus_selected(key)
        sel = _counts(sel_uri, column) if storage.exists(sel_uri) else {}
        if raw is None or sel is None:
            return None
        for name, c in raw.items():
            r, s_ = out.get(name, (0, 0))
            out[name] = (r + c, s_ + sel.get(name, 0))
    return out or None


def _sources_md(sources: dict, column: str = "source") -> str:
    total = max(1, sum(s for _, s in sources.values()))
    lines = [f"| {column} | rows | selected | kept | share of the selection |",
             "|---|---:|---:|---:|---:|"]
    for name, (r, c) in sorted(sources.items(), key=lambda kv: -kv[1][1]):
        lines.append(f"| {name} | {r:,} | {c:,} | {c / max(1, r):.1%} | {c / total:.1%} |")
    return "\n".join(lines)
