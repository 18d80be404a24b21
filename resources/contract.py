"""The data contract of raw shards: which columns hold the id, quality and embedding, and the
declared rules (embedding dimension, quality range) the validation checks enforce.

The contract itself (types, rules, error messages) is the engine's (``engine.data``); this
resource only carries the per-deployment settings.
"""

from __future__ import annotations

from typing import Optional

import dagster as dg
from pydantic import Field, field_validator, model_validator

from datamask_pipeline import settings
from datamask_pipeline.engine import contract as C
from datamask_pipeline.engine.data import Columns
from datamask_pipeline.engine.embed import DEFAULT_LANGUAGE_GEOMETRY, LANGUAGE_GEOMETRIES

# The contract's settings that dg.EnvVar cannot fill (a list, a float): their variables, given
# to the resource as strings (``string_settings``).
STRING_FIELDS = {
    "quality_columns": settings.ENV_QUALITY_COLUMNS,
    "quality_weights": settings.ENV_QUALITY_WEIGHTS,
    "quality_min": settings.ENV_QUALITY_MIN,
    "quality_max": settings.ENV_QUALITY_MAX,
}


def _parse_string(field: str, value: str):
    """One string setting as its field's value: comma-separated names or numbers for the lists,
    one number (or blank: unset) for the range ends. Errors name the field and its variable."""
    where = f"contract setting {field} (env {STRING_FIELDS[field]}) = {value!r}"
    parts = [p.strip() for p in str(value).split(",") if p.strip()]
    if field == "quality_columns":
        if not parts:
            raise ValueError(f"{where}: expected one or more column names, comma-separated")
        return parts
    try:
        numbers = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"{where}: expected numbers") from None
    if field == "quality_weights":
        return numbers or None
    if len(numbers) > 1:
        raise ValueError(f"{where}: expected one number")
    return numbers[0] if numbers else None


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
    text_column: Optional[str] = Field(
        default="text",
        description="Raw text column. A shard without the embedding column but with this one "
        "is embedded from its text while ingesting (engine.embed). Unset: embeddings required.",
    )
    embedding_model: str = Field(
        default="wordllama",
        description="Model for text-only shards: wordllama (default; ships in its PyPI package, "
        "runs offline, 256-d; wordllama:128 / wordllama:64 truncate it) or a sentence-"
        "transformers model name or local directory. Changing it changes the features' data "
        "version.",
    )
    embedding_max_tokens: Optional[int] = Field(
        default=None,
        description="Tokens embedded per text (per window when pooling is chunks). Unset: the "
        "model's limit (512 for wordllama); longer texts are truncated.",
    )
    embedding_pooling: str = Field(
        default="truncate",
        description="Long texts: truncate (embed the first max tokens) or chunks (embed windows "
        "of max tokens, up to 64, and average them by token count).",
    )
    embedding_language_geometry: str = Field(
        default=DEFAULT_LANGUAGE_GEOMETRY,
        description="The geometry the diversity terms see when a text-only shard is embedded "
        "and its languages are known (the heuristic quality scorer detects them): center "
        "(default) subtracts each language's mean vector where the vectors are read (the "
        "shard's mean in the shard's steps, the whole corpus's in the corpus stage, so the "
        "corpus's selection does not depend on how it is cut into files), so that an "
        "English-centric model's placement of the languages is not read as diversity; off: "
        "the model's vectors as they are (upstream). The features keep the model's vectors "
        "(and, with center, each language's sums in their footer).",
    )
    quality_scorer: str = Field(
        default="heuristic",
        description="Quality for shards without the quality column(s) but with the text column, "
        "scored while ingesting (engine.quality): heuristic (default; offline, CPU, Gopher/C4/"
        "FineWeb-style signals, a score in [0, 1]), fasttext:/path/model.bin[#label], hf:/path/"
        "dir[#label], or several comma-separated with =weight, summed. Models are local paths, "
        "never downloaded. '' : the quality column is required. Changing it changes the "
        "features' data version.",
    )
    quarantine_share: float = Field(
        default=C.DEFAULT_QUARANTINE_SHARE, ge=0.0, le=1.0,
        description="Share of a shard's rows that may break a row rule of the text (null, not "
        "UTF-8, blank: read only when the shard is embedded or scored from its text) and be "
        "quarantined: written to rejects/<shard>.parquet (id, rule, raw row number) and left "
        "out of the features, while the other rows proceed. More than this share (count > "
        "share x rows) rejects the shard, naming the rule, the count and the first ids. 0: any "
        "such row rejects the shard. The structural rules (ids, types, embedding dimensions) "
        "always reject it.",
    )
    string_settings: dict[str, str] = Field(
        default={},
        description="Settings given as strings, as environment variables arrive: {field: string}, "
        "parsed when the run starts into quality_columns / quality_weights (comma-separated) "
        "or quality_min / quality_max (a number), replacing that field. from_env() fills it "
        "with dg.EnvVar(DATAMASK_QUALITY_COLUMNS / _WEIGHTS / _MIN / _MAX).",
    )

    @field_validator("embedding_language_geometry")
    @classmethod
    def _check_language_geometry(cls, v):
        if v not in LANGUAGE_GEOMETRIES:
            raise ValueError(f"embedding_language_geometry must be one of "
                             f"{LANGUAGE_GEOMETRIES}, got {v!r}")
        return v

    @model_validator(mode="before")
    @classmethod
    def _parse_string_settings(cls, data):
        """String settings into their typed fields. While the definitions load the values are
        still ``dg.EnvVar`` names (nothing to parse); Dagster resolves them when a run starts
        and builds the resource again, with the strings."""
        if not isinstance(data, dict) or not data.get("string_settings"):
            return data
        given = data["string_settings"]
        unknown = sorted(set(given) - set(STRING_FIELDS))
        if unknown:
            raise ValueError(f"string_settings: unknown setting(s) {unknown}: choose from {list(STRING_FIELDS)}")
        out = dict(data)
        for field, value in given.items():
            if isinstance(value, dg.EnvVar):
                continue
            out[field] = _parse_string(field, value)
        return out

    @classmethod
    def from_env(cls) -> "DataContract":
        """Every contract variable that is set now as a ``dg.EnvVar`` (read again when each run
        starts); the field defaults for the others."""
        kw = {field: dg.EnvVar(name) for field, name in
              (("id_column", settings.ENV_ID_COLUMN), ("embedding_column", settings.ENV_EMBEDDING_COLUMN))
              if settings.is_set(name)}
        if settings.is_set(settings.ENV_QUALITY_SCORER):
            kw["quality_scorer"] = dg.EnvVar(settings.ENV_QUALITY_SCORER)
        if settings.is_set(settings.ENV_EMBEDDING_DIM):
            kw["expected_dim"] = dg.EnvVar.int(settings.ENV_EMBEDDING_DIM)
        strings = {field: dg.EnvVar(name) for field, name in STRING_FIELDS.items()
                   if settings.is_set(name)}
        return cls(**kw, string_settings=strings) if strings else cls(**kw)

    def columns(self) -> Columns:
        """The engine's column mapping (validates names and weights)."""
        return Columns(
            id=self.id_column,
            quality=tuple(self.quality_columns),
            quality_weights=None if self.quality_weights is None else tuple(self.quality_weights),
            embedding=self.embedding_column,
            text=self.text_column,
            quality_from_text=bool((self.quality_scorer or "").strip()),
        )

    def embedder(self):
        """The embedding model for text-only shards (``engine.embed``), loaded on call."""
        from datamask_pipeline.engine.embed import load_embedder

        return load_embedder(self.embedding_model, max_tokens=self.embedding_max_tokens,
                             pooling=self.embedding_pooling)

    def scorer(self):
        """The quality scorer for shards without quality (``engine.quality``), loaded on call."""
        from datamask_pipeline.engine.quality import load_scorer

        return load_scorer(self.quality_scorer)

    @property
    def quality_range(self) -> tuple | None:
        if self.quality_min is None and self.quality_max is None:
            return None
        return (self.quality_min, self.quality_max)
