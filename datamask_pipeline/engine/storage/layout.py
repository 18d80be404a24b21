"""The data root's layout: where raw shards are read and every output is written.

Under the data root (a local path or a URI such as ``s3://bucket/datamask``)::

    raw/<key>.parquet              raw shards (another location via ``raw``)
    features/<key>.parquet         canonical id / quality / embedding (ingestion)
    masks/<key>.parquet            per-sample id / logit / rank / selected (mask learning)
    corpus/selection.json          the corpus selection's facts and manifest (the files below)
    corpus/selection/<v>/<key>.parquet  the selection's rows of each shard (shard, raw file,
                                   row, id), written by the shard's own task; <v> is the
                                   version that selection.json names
    selected/<key>.parquet         the corpus selection's raw rows of each shard, every raw column
    selected_per_shard/<key>.parquet  the per-shard chain's subset (selected_subset)
    reports/<key>/                 the shard report (HTML + PNG + metrics JSON)
    checkpoints/<key>.pt           the learner's checkpoint while a run is in flight
    catalog.duckdb                 the corpus catalog (corpus summary)
    corpus_report/                 the corpus report (HTML + PNG + metrics JSON)

Every derived path goes through :func:`safe_child` after the partition key was validated,
so a key can never name a file outside the root. The ``data_root`` resource is a
:class:`DataLayout`; the engine takes one where it reads or writes the data root.
"""

from __future__ import annotations

from .keys import safe_child, validate_partition_key
from .uris import join

__all__ = ["DataLayout"]


class DataLayout:
    """The locations under ``root`` (and ``raw``, the raw shards' folder: default
    ``<root>/raw``)."""

    def __init__(self, root: str, raw: str | None = None):
        self.root, self.raw = root, raw

    @property
    def raw_root(self) -> str:
        return self.raw or join(self.root, "raw")

    def _child(self, *parts: str) -> str:
        return safe_child(self.root, "/".join(parts))

    @staticmethod
    def _key(key: str) -> str:
        return validate_partition_key(key)

    def raw_shard(self, key: str) -> str:
        return safe_child(self.raw_root, f"{self._key(key)}.parquet", allow_subdirs=False)

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
        """The corpus stage's state: ``corpus/selection.json`` (the facts and the manifest of
        ``corpus/selection/<version>/<key>.parquet``, each shard's selected rows: shard, raw
        file, row, id), ``corpus/subsets.json``,
        ``corpus/duplicates.parquet``, ``corpus/dedup.json``, the report."""
        return self._child("corpus")

    def corpus_selection_dir(self, version: str | None = None) -> str:
        """``corpus/selection`` (every version's folder), or one version's folder."""
        base = self._child("corpus", "selection")
        return base if version is None else safe_child(base, self._key(version),
                                                        allow_subdirs=False)

    def corpus_selection_file(self, version: str, key: str) -> str:
        """One shard's selected rows in a version of the corpus selection."""
        return safe_child(self.corpus_selection_dir(version), f"{self._key(key)}.parquet",
                          allow_subdirs=False)

    def corpus_file(self, name: str) -> str:
        """A file of the corpus stage's state (``corpus/<name>``)."""
        return join(self.corpus_dir(), name)

    def report_dir(self, key: str) -> str:
        return self._child("reports", self._key(key))

    def checkpoint(self, key: str) -> str:
        return self._child("checkpoints", f"{self._key(key)}.pt")

    def catalog(self) -> str:
        return self._child("catalog.duckdb")

    def corpus_report_dir(self) -> str:
        return self._child("corpus_report")
