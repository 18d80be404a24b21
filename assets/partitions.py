"""Partitions = shards: every raw parquet file ``<raw>/<key>.parquet`` is one partition of the
dynamic partitions definition ``shards``. Keys come from file names (``storage.partition_key_for``)
and are validated: letters, digits, '.', '_' and '-' only, no '..', no leading '.'.

Shards are registered by the ``raw_shard_sensor`` (with the daemon), by
``python -m datamask_pipeline.register`` (without it), or by :func:`register_shards`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import dagster as dg

from datamask_pipeline.engine import storage

PARTITIONS_NAME = "shards"

shards = dg.DynamicPartitionsDefinition(name=PARTITIONS_NAME)


@dataclass
class RawScan:
    """What is in the raw location: valid shards by key, and files whose names cannot be
    partition keys (with the reason)."""

    shards: dict = field(default_factory=dict)  # key -> uri
    invalid: list = field(default_factory=list)  # (uri, reason)
    files: dict = field(default_factory=dict)  # key -> (size, mtime ns), from the one listing

    def signature(self, key: str) -> str:
        """``<size>:<mtime ns>``: changes when the file is replaced or rewritten."""
        size, mtime_ns = self.files[key]
        return f"{size}:{mtime_ns}"


def scan_raw(raw_root) -> RawScan:
    """List ``*.parquet`` files directly under ``raw_root`` and derive their partition keys.
    A file that is a symlink resolving outside ``raw_root`` is invalid (it could never be read:
    ``DataRoot.raw_shard`` refuses it)."""
    out = RawScan()
    for uri, info in storage.list_file_infos(raw_root, suffix=".parquet").items():
        try:
            key = storage.partition_key_for(uri)
            storage.safe_child(raw_root, uri.rstrip("/").rsplit("/", 1)[-1], allow_subdirs=False)
        except (ValueError, storage.StorageError) as exc:
            out.invalid.append((uri, str(exc)))
            continue
        out.shards[key] = uri
        out.files[key] = info
    return out


RAW_SHARD_KEY = dg.AssetKey("raw_shard")


def raw_observations(scan: RawScan, keys) -> list:
    """One ``raw_shard`` observation per key: its data version is the file's signature from the
    listing (what the observable source ``raw_shard`` reports for it)."""
    return [dg.AssetObservation(asset_key=RAW_SHARD_KEY, partition=key,
                                tags={"dagster/data_version": scan.signature(key)})
            for key in keys]


def register_shards(instance: dg.DagsterInstance, raw_root) -> dict:
    """Register every shard under ``raw_root`` that is not yet a partition. No observation is
    recorded: a new partition is newly missing, which is what automation launches on.

    Returns ``{"added": [keys], "existing": [keys], "invalid": [(uri, reason)]}``; files whose
    names are not valid keys are reported, never registered."""
    scan = scan_raw(raw_root)
    known = set(instance.get_dynamic_partitions(PARTITIONS_NAME))
    added = [k for k in sorted(scan.shards) if k not in known]
    if added:
        instance.add_dynamic_partitions(PARTITIONS_NAME, added)
    return {
        "added": added,
        "existing": sorted(k for k in scan.shards if k in known),
        "invalid": scan.invalid,
    }
