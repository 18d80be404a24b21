"""The refresh schedule (missing / stale shards only) and the raw-shard sensor."""

import os
import shutil
import time
from datetime import datetime, timezone

import dagster as dg
import pyarrow.parquet as pq

from assets.partitions import PARTITIONS_NAME
from datamask_pipeline.definitions import defs
from datamask_pipeline.engine.sample import make_table
from datamask_pipeline.schedules import refresh_stale_shards
from datamask_pipeline.sensors import raw_shard_sensor

from .helpers import DIM, KEYS, ROWS

FEATURES_ONLY = dg.AssetSelection.assets("features").without_checks()


def _schedule(instance, data_root) -> tuple[dict, str | None]:
    with dg.build_schedule_context(instance=instance, resources={"data_root": data_root},
                                   scheduled_execution_time=datetime.now(timezone.utc),
                                   repository_def=defs.get_repository_def()) as ctx:
        data = refresh_stale_shards.evaluate_tick(ctx)
    reqs = {r.partition_key: r.tags["datamask/reason"] for r in data.run_requests or []}
    assert len(reqs) == len(data.run_requests or [])  # one run per shard
    assert all(r.run_key.startswith(f"{r.partition_key}@") for r in data.run_requests or [])
    return reqs, data.skip_message


def test_schedule_requests_missing_and_stale_shards_only(registered, run_chain, instance, data_root):
    a, b, c = registered
    reqs, _ = _schedule(instance, data_root)
    assert reqs == {k: "missing: no selected subset yet" for k in registered}

    # a and b selected with the scheduled (default) config; c never
    run_chain(a, mask_config=None)
    run_chain(b, mask_config=None)
    reqs, _ = _schedule(instance, data_root)
    assert reqs == {c: "missing: no selected subset yet"}

    # b re-ingested after its selection: stale; a re-learned with another config: stale
    run_chain(b, selection=FEATURES_ONLY)
    run_chain(a, seed=5)
    reqs, _ = _schedule(instance, data_root)
    assert set(reqs) == {a, b, c}
    assert reqs[b] == "stale: features were re-materialized after the mask"
    assert reqs[a].startswith("stale: config hash ") and "scheduled config" in reqs[a]

    # run what the schedule asked for: everything up to date, the tick skips
    for key in reqs:
        run_chain(key, mask_config=None)
    reqs, skip = _schedule(instance, data_root)
    assert reqs == {} and skip == "every registered shard has an up-to-date selection"

    # the raw file of c rewritten after its ingestion (mtime = now)
    os.utime(data_root.raw_shard(c))
    reqs, _ = _schedule(instance, data_root)
    assert reqs == {c: "stale: the raw shard was modified after ingestion"}
    run_chain(c, mask_config=None)

    # a selection recorded by an older code version of the subset step
    instance.report_runless_asset_event(dg.AssetMaterialization(
        asset_key="selected_subset", partition=a, tags={"dagster/code_version": "selected-0"}))
    reqs, _ = _schedule(instance, data_root)
    assert reqs == {a: "stale: code version of selected_subset changed (selected-0 -> selected-1)"}


def _tick(instance, data_root, cursor=None):
    # Called directly, as the daemon's evaluation does before it applies the partition requests
    # (evaluate_tick would validate the run requests' keys against the not yet added ones).
    with dg.build_sensor_context(instance=instance, cursor=cursor,
                                 resources={"data_root": data_root}) as ctx:
        out = raw_shard_sensor(ctx)
    return dg.SensorResult(skip_reason=out) if isinstance(out, dg.SkipReason) else out


def test_sensor_registers_new_shards_and_requests_runs(instance, corpus, data_root):
    shutil.copyfile(data_root.raw_shard(KEYS[0]), os.path.join(data_root.raw_root, "bad name.parquet"))
    first = _tick(instance, data_root)
    [add] = first.dynamic_partitions_requests
    assert add.partitions_def_name == PARTITIONS_NAME and list(add.partition_keys) == KEYS
    assert [r.partition_key for r in first.run_requests] == KEYS  # 'bad name' skipped
    assert all(r.tags["datamask/trigger"] == "new shard" for r in first.run_requests)
    assert all(r.run_key.startswith(f"{r.partition_key}:") for r in first.run_requests)
    instance.add_dynamic_partitions(PARTITIONS_NAME, list(add.partition_keys))  # as the daemon does

    second = _tick(instance, data_root, first.cursor)
    assert not second.run_requests and not second.dynamic_partitions_requests
    assert second.skip_reason.skip_message == "no new or rewritten shards"

    # a shard rewritten in place, and a new one dropped in
    pq.write_table(make_table(ROWS, dim=DIM, seed=42, id_offset=ROWS), data_root.raw_shard(KEYS[1]))
    later = time.time() + 30
    os.utime(data_root.raw_shard(KEYS[1]), (later, later))
    pq.write_table(make_table(ROWS, dim=DIM, seed=43, id_offset=9 * ROWS), data_root.raw_shard("shard_new"))
    third = _tick(instance, data_root, second.cursor)
    assert {r.partition_key: r.tags["datamask/trigger"] for r in third.run_requests} == {
        KEYS[1]: "raw shard rewritten", "shard_new": "new shard"}
    assert list(third.dynamic_partitions_requests[0].partition_keys) == ["shard_new"]


def test_sensor_first_look_at_shards_registered_by_the_cli(instance, registered, data_root, run_chain):
    run_chain(registered[0])  # one already has a selection
    tick = _tick(instance, data_root)
    assert not tick.dynamic_partitions_requests
    assert {r.partition_key: r.tags["datamask/trigger"] for r in tick.run_requests} == {
        k: "registered shard without a selection" for k in registered[1:]}


def _observed(instance, key):
    recs = instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("raw_shard"), asset_partitions=[key]),
        limit=1).records
    return recs[0].asset_observation.data_version if recs else None


def test_sensor_records_raw_shard_data_versions_from_one_listing(instance, corpus, data_root):
    first = _tick(instance, data_root)
    for event in first.asset_events:  # as the daemon does, before it adds the partitions
        instance.report_runless_asset_event(event)
    instance.add_dynamic_partitions(PARTITIONS_NAME, list(first.dynamic_partitions_requests[0].partition_keys))

    def signature(key):
        st = os.stat(data_root.raw_shard(key))
        return f"{st.st_size}:{st.st_mtime_ns}"

    assert {k: _observed(instance, k) for k in KEYS} == {k: signature(k) for k in KEYS}
    # (Dagster 1.13 does not take these observations as the input data version of the
    # partitioned features: measured, its dagster/input_data_version/raw_shard tag stays the
    # default even for an observable source. The features' own content hash is what makes the
    # mask stale after a re-ingestion.)

    # an unchanged listing records nothing new; a rewritten file gets a new data version
    second = _tick(instance, data_root, first.cursor)
    assert not second.asset_events
    later = time.time() + 60
    os.utime(data_root.raw_shard(KEYS[0]), (later, later))
    third = _tick(instance, data_root, second.cursor)
    assert [(e.partition, e.tags["dagster/data_version"]) for e in third.asset_events] == [
        (KEYS[0], signature(KEYS[0]))]


def test_schedule_requests_at_most_the_cap_per_tick(registered, instance, data_root, monkeypatch):
    monkeypatch.setenv("DATAMASK_SCHEDULE_MAX_RUNS", "2")
    reqs, _ = _schedule(instance, data_root)
    assert sorted(reqs) == sorted(registered)[:2]  # the third waits for the next tick
