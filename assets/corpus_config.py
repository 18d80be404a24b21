"""The corpus stage's configs: ``CorpusConfig`` (the corpus budget and mode, with every mask
knob of ``MaskConfig``) and ``DedupConfig`` (the deduplication before the selection), each knob
documented for the Launchpad."""

from typing import Optional

import dagster as dg
from pydantic import Field, create_model

from datamask_pipeline.engine.corpus.dedup import (DEFAULT_CONTAINMENT, DEFAULT_THRESHOLD,
                                                    NEAR_MIN_CONTAINMENT)

from .mask_config import MaskConfig

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


def dedup_engine(config: DedupConfig) -> str:
    """The dedup engine the config names (a readable failure for any other)."""
    engine = config.engine.strip().lower()
    if engine not in DEDUP_ENGINES:
        raise dg.Failure(description=(
            f"corpus_dedup: engine must be one of {list(DEDUP_ENGINES)} "
            f"(config key corpus_dedup.config.engine), got {config.engine!r}"),
            allow_retries=False)
    return engine
