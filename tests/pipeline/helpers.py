"""Constants and helpers shared by the pipeline tests (imported after conftest set the
environment)."""

import os

import dagster as dg

from assets.ingest import features, raw_shard
from assets.learn import mask
from assets.report import corpus_summary
from assets.select import selected_subset
from assets.shard_report import shard_report
from assets.validate import validate_features

SHARDS, ROWS, DIM = 3, 400, 16
KEYS = [f"shard_{i:03d}" for i in range(SHARDS)]
# A tiny but real run: k = 40 of 400, batches of 40 rows, masks of k' = 4.
TINY = dict(n_epochs=30, n_rollout=16, partial=0.1, select_ratio=0.1)
ALL_ASSETS = [raw_shard, features, mask, shard_report, selected_subset, corpus_summary,
              validate_features]
CHAIN = dg.AssetSelection.assets(features, mask, selected_subset)


def tree_bytes(root) -> dict:
    """{relative path: bytes} of every file under ``root``."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = fh.read()
    return out


def temp_leftovers(root) -> list:
    return sorted(p for p in tree_bytes(root) if ".tmp-" in p)
