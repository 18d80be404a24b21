"""The data root: where raw shards are read and every per-partition output is written.

Layout under the data root (a local path or a URI such as ``s3://bucket/datamask``)::

    raw/<key>.parquet              raw shards (another location via ``raw``)
    features/<key>.parquet         canonical id / quality / embedding (ingestion)
    masks/<key>.parquet            per-sample id / logit / rank / selected (mask learning)
    corpus/selection.parquet       the corpus selection: every selected row's shard, raw file, row, id
    selected/<key>.parquet         the corpus selection's raw rows of each shard, every raw column
    selected_per_shard/<key>.parquet  the per-shard chain's subset (selected_subset)
    reports/<key>/                 the shard report (HTML + PNG + metrics JSON)
    checkpoints/<key>.pt           the learner's checkpoint while a run is in flight
    catalog.duckdb                 the corpus catalog (corpus summary)
    corpus_report/                 the corpus report (HTML + PNG + metrics JSON)

Every derived path goes through ``storage.safe_child`` after the partition key was validated,
so a key can never name a file outside the root.
"""

from __future__ import annotations

from typing import Optional

import dagster as dg
from pydantic import Field

from datamask_pipeline import settings
from datamask_pipeline.engine import storage


class DataRoot(dg.ConfigurableResource):
    """Owns the data root URI, the raw location and the derived per-partition paths."""

    root: str = Field(
        default_factory=settings.default_data_root,
        description="Data root: a local path or URI (s3://, gs://, file://). Default: <repo>/data; "
        "from_env() reads env DATAMASK_DATA_ROOT when a run starts.",
    )
    raw: Optional[str] = Field(
        default=None,
        description="Where raw shards (*.parquet, one partition each) are read. Default: "
        "<root>/raw; from_env() reads env DATAMASK_RAW_ROOT when a run starts.",
    )

    @classmethod
    def from_env(cls) -> "DataRoot":
        """``DATAMASK_DATA_ROOT`` / ``DATAMASK_RAW_ROOT`` as ``dg.EnvVar`` fields when they are
        set now (read again when each run starts), the defaults otherwise."""
        kw = {field: dg.EnvVar(name) for field, name in
              (("root", settings.ENV_DATA_ROOT), ("raw", settings.ENV_RAW_ROOT))
              if settings.is_set(name)}
        kw.setdefault("root", settings.default_data_root())  # spelled out: the UI shows it
        return cls(**kw)

    # ------------------------------------------------------------------ locations
    @property
    def raw_root(self) -> str:
        return self.raw or storage.join(self.root, "raw")

    def _child(self, *parts: str) -> str:
        return storage.safe_child(self.root, "/".join(parts))

    @staticmethod
    def _key(key: str) -> str:
        return storage.validate_partition_key(key)

    def raw_shard(self, key: str) -> str:
        return storage.safe_child(self.raw_root, f"{self._key(key)}.parquet", allow_subdirs=False)

    def features(self, key: str) -> str:
        return self._child("features", f"{self._key(key)}.parquet")

    def rejects(self, key: str) -> str:
        """The rows of a shard quarantined at ingestion (``rejects/<key>.parquet``: id, rule,
        raw row number, column); absent when none was."""
        return self._child("rejects", f"{self._key(key)}.parquet")

    def mask(self, key: str) -> str:
        return self._child("masks", f"{self._key(key)}.parquet")

    def selected(self, key: str) -> str:
        """The per-shard chain's subset (``selected_per_shard/<key>.parquet``: the paper's
        independent blocks, one setting away from the corpus selection)."""
        return self._child("selected_per_shard", f"{self._key(key)}.parquet")

    @property
    def selected_root(self) -> str:
        """Where the per-shard chain's subsets live (``selected_per_shard/<key>.parquet``)."""
        return self._child("selected_per_shard")

    def corpus_selected(self, key: str) -> str:
        """The corpus selection's rows of one shard (``selected/<key>.parquet``)."""
        return self._child("selected", f"{self._key(key)}.parquet")

    @property
    def corpus_selected_root(self) -> str:
        return self._child("selected")

    def corpus_dir(self) -> str:
        """The corpus stage's state: ``corpus/selection.parquet`` (every selected row: shard,
        raw file, row, id), ``corpus/selection.json``, ``corpus/subsets.json``, the report."""
        return self._child("corpus")

    def report_dir(self, key: str) -> str:
        return self._child("reports", self._key(key))

    def checkpoint(self, key: str) -> str:
        return self._child("checkpoints", f"{self._key(key)}.pt")

    def catalog(self) -> str:
        return self._child("catalog.duckdb")

    def corpus_report_dir(self) -> str:
        return self._child("corpus_report")
