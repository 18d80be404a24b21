"""Partitioned reruns: a new config replaces exactly one partition; failed reruns leave the
previous outputs in place; a retried mask step resumes from its checkpoint."""

import math
import os

import dagster as dg

from assets.learn import MaskConfig, read_features
from datamask_pipeline.engine.learner import learn

from .helpers import TINY, tree_bytes


def _latest_mask_meta(instance, key):
    recs = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("mask"), asset_partitions=[key]), limit=1).records
    return recs[0].asset_materialization.metadata


def test_rerun_with_new_config_replaces_only_that_partition(registered, run_chain, data_root, instance):
    a, b = registered[:2]
    run_chain(a)
    run_chain(b)
    before = tree_bytes(data_root.root)
    old_hash = _latest_mask_meta(instance, b)["config_hash"].value

    assert run_chain(b, seed=11, lamb=0.3, solver="paper+polish").success
    after = tree_bytes(data_root.root)
    assert set(after) == set(before)  # same files: no temp files, no checkpoint, nothing removed
    changed = sorted(p for p in before if after[p] != before[p])
    # partition a: every file byte-identical; partition b: features identical (same raw),
    # the learned outputs replaced
    assert not [p for p in changed if a in p]
    assert f"masks/{b}.parquet" in changed and f"selected_per_shard/{b}.parquet" in changed
    assert f"features/{b}.parquet" not in changed and f"raw/{b}.parquet" not in changed
    assert all(b in p for p in changed), changed
    meta = _latest_mask_meta(instance, b)
    new_hash = meta["config_hash"].value
    assert new_hash == MaskConfig(**{**TINY, "seed": 11, "lamb": 0.3, "solver": "paper+polish"}
                                  ).learner_config().config_hash()
    # the polished selection is the one scored and written
    assert math.isclose(meta["polish"].value["f_end"], meta["f_datamask"].value, rel_tol=1e-5)
    assert new_hash != old_hash
    assert _latest_mask_meta(instance, a)["config_hash"].value == old_hash


def test_failed_reruns_keep_previous_outputs(registered, run_chain, data_root):
    key = registered[0]
    run_chain(key)
    before = tree_bytes(data_root.root)

    # an impossible configuration fails before anything is written
    result = run_chain(key, raise_on_error=False, partial=0.001, solver="paper")
    assert not result.success
    text = [e for e in result.all_events if e.is_step_failure][0].step_failure_data.error.message
    assert f"partition '{key}'" in text and "partial=0.001" in text
    assert tree_bytes(data_root.root) == before

    # the raw shard is replaced by a truncated file: ingestion fails, the last good features,
    # mask and subset stay as they were
    raw = data_root.raw_shard(key)
    with open(raw, "rb") as fh:
        data = fh.read()
    with open(raw, "wb") as fh:
        fh.write(data[: len(data) // 2])
    result = run_chain(key, raise_on_error=False)
    assert not result.success
    text = [e for e in result.all_events if e.is_step_failure][0].step_failure_data.error.message
    assert "not a readable parquet file" in text and raw in text
    after = tree_bytes(data_root.root)
    rel_raw = os.path.relpath(raw, data_root.root)
    assert {p: v for p, v in after.items() if p != rel_raw} == {p: v for p, v in before.items() if p != rel_raw}


def test_retried_mask_step_resumes_from_checkpoint(registered, run_chain, data_root, resources):
    key = registered[0]
    assert run_chain(key, solver="paper").success  # the learner: what checkpoints belong to
    with open(data_root.mask(key), "rb") as fh:
        uninterrupted = fh.read()

    # An attempt that died after 10 of 30 steps leaves the engine's checkpoint behind (same
    # config, same data, same device): exactly what a RetryPolicy retry finds.
    shard = read_features(data_root.features(key), resources["contract"])
    cfg = MaskConfig(**TINY, solver="paper").learner_config()
    ckpt = data_root.checkpoint(key)
    learn(shard.embeddings, shard.quality, cfg, ids=shard.ids, device="cpu",
          checkpoint_path=ckpt, checkpoint_every=10, max_steps=10)
    assert os.path.exists(ckpt)

    result = run_chain(key, selection=[dg.AssetKey("mask")], solver="paper")
    meta = result.get_asset_materialization_events()[0].materialization.metadata
    assert meta["resumed_from_step"].value == 10
    assert meta["steps"].value == TINY["n_epochs"]
    with open(data_root.mask(key), "rb") as fh:
        assert fh.read() == uninterrupted  # resuming continues the same trajectory exactly
    assert not os.path.exists(ckpt)

    # a checkpoint of another config is not resumed from
    learn(shard.embeddings, shard.quality, cfg.replace(seed=99), ids=shard.ids, device="cpu",
          checkpoint_path=ckpt, checkpoint_every=10, max_steps=10)
    result = run_chain(key, selection=[dg.AssetKey("mask")], solver="paper")
    assert result.get_asset_materialization_events()[0].materialization.metadata["resumed_from_step"].value == 0
