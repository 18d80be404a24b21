"""The corpus run's state, kept with the shards instead of in the coordinator: each shard's
selected rows (one small file per shard and version) and the coordinator's round (its
statistics, round log and which version of each shard is current).

Everything goes through the storage layer, so the state lives on any data root (a local
folder or ``s3://``): a killed run resumes from its last round on the same root. Files are
written under a temporary name and renamed (:func:`storage.atomic_write_bytes`), so a kill
never leaves half a state. One directory per run key (the config, mode, budget and every
shard's key, size and version): a run with other inputs never reads another's state.
"""

from __future__ import annotations

import hashlib
import io
import json

import numpy as np

from .. import storage

__all__ = ["RunState"]


def _npz_bytes(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def _npz_read(blob: bytes) -> dict:
    with np.load(io.BytesIO(blob), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


class RunState:
    """The state of one corpus run under ``root`` (a path or URI). Picklable (two strings):
    the per-shard tasks read and write their shard's files themselves."""

    def __init__(self, root: str, identity: dict):
        blob = json.dumps(identity, sort_keys=True, default=str).encode()
        self.key = hashlib.sha256(blob).hexdigest()[:16]
        self.dir = storage.join(root, self.key)

    def _uri(self, name: str) -> str:
        return storage.join(self.dir, name)

    def prepare(self) -> None:
        storage.makedirs(self.dir)

    # ---- per shard: the selected rows (the kept rows' numbering), by version
    def rows_uri(self, index: int, version: int) -> str:
        return self._uri(f"rows-{index:06d}-v{version:05d}.npz")

    def save_rows(self, index: int, version: int, rows: np.ndarray, route: str = "") -> None:
        storage.atomic_write_bytes(self.rows_uri(index, version), _npz_bytes(
            rows=np.asarray(rows, dtype=np.int64), route=np.array(route)))

    def load_rows(self, index: int, version: int):
        """(rows, route) of a shard's version, or None when it was never written."""
        uri = self.rows_uri(index, version)
        if not storage.exists(uri):
            return None
        z = _npz_read(storage.read_bytes(uri))
        return z["rows"], str(z["route"])

    # ---- the coordinator: the last finished round
    def save_round(self, r: int, versions: list, parts: dict, log: list, extra: dict) -> None:
        storage.atomic_write_bytes(self._uri("round.npz"), _npz_bytes(
            round=np.array(r), versions=np.asarray(versions, dtype=np.int64),
            log=np.array(json.dumps(log)), extra=np.array(json.dumps(extra)),
            **{f"part_{n}": np.asarray(v, dtype=np.float64) for n, v in parts.items()}))

    def load_round(self):
        """(round, versions, parts, log, extra) of the last finished round, or None."""
        uri = self._uri("round.npz")
        if not storage.exists(uri):
            return None
        z = _npz_read(storage.read_bytes(uri))
        parts = {k[len("part_"):]: v for k, v in z.items() if k.startswith("part_")}
        return (int(z["round"]), [int(v) for v in z["versions"]], parts,
                json.loads(str(z["log"])), json.loads(str(z["extra"])))

    def clear(self) -> None:
        storage.remove(self.dir, recursive=True)
