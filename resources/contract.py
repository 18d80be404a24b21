"""The data contract of raw shards: which columns hold the id, quality and embedding, and the
declared rules (embedding dimension, quality range) the validation checks enforce.

The contract itself (types, rules, error messages) is the engine's (``engine.data``); this
resource only carries the per-deployment settings.
"""

from __future__ import annotations

import os
from typing import Optional

import dagster as dg
from pydantic import Field

from datamask_pipeline import settings
from datamask_pipeline.engine.data import Columns


class DataContract(dg.ConfigurableResource):
    """Column names of the raw shards and the declared value rules."""

    id_column: str = Field(default="chunk_id", description="Raw id column (integer or string, unique, non-null).")
    quality_columns: list[str] = Field(
        default=["quality_score"],
        description="Raw numeric quality column(s); several are summed (weighted) into the "
        "quality score q, as the paper sums DCLM + FineWeb-Edu + Wiki scores.",
    )
    quality_weights: Optional[list[float]] = Field(
        default=None, description="Weights of the quality columns (default: all 1)."
    )
    embedding_column: str = Field(
        default="feature_arr", description="Raw embedding column: a list of floats per row."
    )
    expected_dim: Optional[int] = Field(
        default=None,
        description="Required embedding dimension (768 in the paper). Unset: any dimension, "
        "but the same for every row of a shard.",
    )
    quality_min: Optional[float] = Field(
        default=None, description="Declared lower bound of each quality column (inclusive)."
    )
    quality_max: Optional[float] = Field(
        default=None, description="Declared upper bound of each quality column (inclusive)."
    )
    source_column: Optional[str] = Field(
        default="source",
        description="Optional raw column with a source/domain label; when present the shard "
        "report shows per-source retention.",
    )

    @classmethod
    def from_env(cls) -> "DataContract":
        kw = {}
        if os.environ.get(settings.ENV_ID_COLUMN):
            kw["id_column"] = os.environ[settings.ENV_ID_COLUMN]
        if settings.env_list(settings.ENV_QUALITY_COLUMNS):
            kw["quality_columns"] = settings.env_list(settings.ENV_QUALITY_COLUMNS)
        if settings.env_list(settings.ENV_QUALITY_WEIGHTS):
            kw["quality_weights"] = [float(w) for w in settings.env_list(settings.ENV_QUALITY_WEIGHTS)]
        if os.environ.get(settings.ENV_EMBEDDING_COLUMN):
            kw["embedding_column"] = os.environ[settings.ENV_EMBEDDING_COLUMN]
        kw["expected_dim"] = settings.env_int(settings.ENV_EMBEDDING_DIM)
        kw["quality_min"] = settings.env_float(settings.ENV_QUALITY_MIN)
        kw["quality_max"] = settings.env_float(settings.ENV_QUALITY_MAX)
        return cls(**kw)

    def columns(self) -> Columns:
        """The engine's column mapping (validates names and weights)."""
        return Columns(
            id=self.id_column,
            quality=tuple(self.quality_columns),
            quality_weights=None if self.quality_weights is None else tuple(self.quality_weights),
            embedding=self.embedding_column,
        )

    @property
    def quality_range(self) -> tuple | None:
        if self.quality_min is None and self.quality_max is None:
            return None
        return (self.quality_min, self.quality_max)
