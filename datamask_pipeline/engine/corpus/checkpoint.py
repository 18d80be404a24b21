"""Checkpoints of the corpus stage, so a killed run resumes: each shard's start selection and
the selection after each exchange round, under one directory per run key (the config, mode,
budget and every shard's key, size and version). A file is written under a temporary name and
renamed, so a kill never leaves half a checkpoint."""

from __future__ import annotations

import hashlib
import json
import os
import shutil

import numpy as np

__all__ = ["Checkpoints"]


class Checkpoints:
    """``directory`` None: no checkpoints (every method is a no-op)."""

    def __init__(self, directory: str | None, identity: dict):
        blob = json.dumps(identity, sort_keys=True, default=str).encode()
        self.key = hashlib.sha256(blob).hexdigest()[:16]
        self.dir = None if directory is None else os.path.join(directory, self.key)
        if self.dir is not None:
            os.makedirs(self.dir, exist_ok=True)

    def _save(self, name: str, **arrays) -> None:
        if self.dir is None:
            return
        tmp = os.path.join(self.dir, f".{name}.tmp.npz")
        np.savez(tmp, **arrays)
        os.replace(tmp, os.path.join(self.dir, f"{name}.npz"))

    def _load(self, name: str):
        if self.dir is None:
            return None
        path = os.path.join(self.dir, f"{name}.npz")
        if not os.path.exists(path):
            return None
        with np.load(path, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}

    def save_part(self, index: int, rows: np.ndarray, route: str) -> None:
        self._save(f"part-{index:06d}", rows=np.asarray(rows, dtype=np.int64),
                   route=np.array(route))

    def load_part(self, index: int):
        z = self._load(f"part-{index:06d}")
        return None if z is None else (z["rows"], str(z["route"]))

    def save_round(self, r: int, masks: list, log: list) -> None:
        self._save("rounds", round=np.array(r), log=np.array(json.dumps(log)),
                   **{f"m{i}": np.packbits(m) for i, m in enumerate(masks)},
                   sizes=np.array([m.size for m in masks], dtype=np.int64))

    def load_round(self):
        z = self._load("rounds")
        if z is None:
            return None
        masks = [np.unpackbits(z[f"m{i}"])[:n].astype(bool) for i, n in enumerate(z["sizes"])]
        return int(z["round"]), masks, json.loads(str(z["log"]))

    def clear(self) -> None:
        if self.dir is not None:
            shutil.rmtree(self.dir, ignore_errors=True)
