"""Declarative automation (datamask_pipeline/automation.py), the raw-shard sensor that only
registers and observes, and the dry-run plan (datamask_pipeline/plan.py)."""

import os
import shutil
import time
from datetime import datetime, timedelta, timezone

import dagster as dg
import pyarrow.parquet as pq
import pytest

from assets.ingest import features, raw_shard
from assets.learn import mask
from assets.partitions import PARTITIONS_NAME, register_shards
from assets.report import corpus_summary
from assets.select import selected_subset
from assets.shard_report import shard_report
from assets.validate import validate_features
from datamask_pipeline import automation, plan
from datamask_pipeline.engine.sample import make_table
from datamask_pipeline.sensors import raw_shard_sensor

from .helpers import DIM, KEYS, ROWS

FEATURES_ONLY = dg.AssetSelection.assets("features").without_checks()
SHARD_ASSETS = [features, mask, shard_report, selected_subset]
# The whole per-shard chain with its checks, run with MaskConfig's defaults.
FULL = dg.AssetSelection.assets(*SHARD_ASSETS)
T0 = datetime(2026, 12, 3, 1, 0, tzinfo=timezone.utc)


def _defs(resources, refresh=None, mask_def=mask, scope="per_shard"):
    """The product's assets under automation, with an optional refresh cron."""
    return dg.Definitions(
        resources=resources,
        assets=automation.automate_with(
            [raw_shard, features, mask_def, shard_report, selected_subset, corpus_summary],
            refresh=refresh, scope=scope),
        asset_checks=[validate_features])


class Evaluator:
    """Successive automation evaluations, as the daemon's sensor runs them (cursor carried)."""

    def __init__(self, instance, defs):
        self.instance, self.defs, self.cursor = instance, defs, None

    def __call__(self, at: datetime) -> dict:
        r = dg.evaluate_automation_conditions(self.defs, self.instance, cursor=self.cursor,
                                              evaluation_time=at)
        self.cursor = r.cursor
        out = {}
        for a in SHARD_ASSETS:
            if r.get_num_requested(a.key):
                out[a.key.to_user_string()] = sorted(r.get_requested_partitions(a.key))
        if r.get_num_requested(corpus_summary.key):
            out["corpus_summary"] = True
        return out


def _chain(keys):
    return {a.key.to_user_string(): sorted(keys) for a in SHARD_ASSETS}


def test_new_and_rewritten_shards_launch_their_chain_and_nothing_else(instance, corpus, data_root,
                                                                      run_chain, resources):
    ev = Evaluator(instance, _defs(resources))
    assert ev(T0) == {}
    # the sensor registers the three new shards (no observation: a new shard is newly missing)
    first = _tick(instance, data_root)
    assert not first.asset_events
    _apply(instance, first)
    assert ev(T0 + timedelta(minutes=1)) == _chain(KEYS)  # each new shard's whole chain
    assert ev(T0 + timedelta(minutes=2)) == {}  # requested once, not again
    for key in KEYS:
        run_chain(key, selection=FULL, mask_config=None)
    later = ev(T0 + timedelta(minutes=3))
    assert later.pop("corpus_summary", None) in (None, True)  # the hourly catalog may be due
    assert later == {}

    # one raw file rewritten: only its chain; an unchanged listing: nothing
    pq.write_table(make_table(ROWS, dim=DIM, seed=42, id_offset=ROWS), data_root.raw_shard(KEYS[1]))
    stamp = time.time() + 30
    os.utime(data_root.raw_shard(KEYS[1]), (stamp, stamp))
    second = _tick(instance, data_root, first.cursor)
    _apply(instance, second)
    assert ev(T0 + timedelta(minutes=4)) == _chain([KEYS[1]])
    _apply(instance, _tick(instance, data_root, second.cursor))
    assert ev(T0 + timedelta(minutes=5)) == {}


def test_code_change_waits_for_the_refresh_cron_and_bad_shards_are_not_relaunched(
        instance, registered, data_root, run_chain, resources):
    a, b, c = registered
    for key in (a, b):
        run_chain(key, selection=FULL, mask_config=None)
    # c: its raw file breaks a blocking check (duplicated ids), so its mask never ran
    table = make_table(ROWS, dim=DIM, seed=9, id_offset=7 * ROWS)
    ids = table.column("chunk_id").to_pylist()
    ids[1] = ids[0]
    pq.write_table(table.set_column(0, "chunk_id", [ids]), data_root.raw_shard(c))
    assert not run_chain(c, selection=FULL, raise_on_error=False, mask_config=None).success

    cron = "0 3 * * *"
    ev = Evaluator(instance, _defs(resources, refresh=cron))
    assert ev(T0) == {}
    # a new code version of mask: nothing before the cron tick ...
    changed = dg.map_asset_specs(lambda s: s.replace_attributes(code_version="mask-next"), [mask])[0]
    ev.defs = _defs(resources, refresh=cron, mask_def=changed)
    assert ev(T0 + timedelta(minutes=1)) == {}
    assert ev(T0 + timedelta(hours=1)) in ({}, {"corpus_summary": True})
    # ... then, at 03:00, one request for the good shards' mask and what follows it; the bad
    # shard waits for a new raw version instead of failing its checks every night
    due = ev(T0 + timedelta(hours=2, minutes=1))
    due.pop("corpus_summary", None)
    assert due == {"mask": [a, b], "shard_report": [a, b], "selected_subset": [a, b]}
    assert ev(T0 + timedelta(hours=2, minutes=2)) == {}


def test_without_a_refresh_cron_a_code_change_launches_nothing(instance, registered, run_chain,
                                                               resources):
    a, b, c = registered
    for key in registered:
        run_chain(key, selection=FULL, mask_config=None)
    ev = Evaluator(instance, _defs(resources))
    ev(T0)
    changed = dg.map_asset_specs(lambda s: s.replace_attributes(code_version="mask-next"), [mask])[0]
    ev.defs = _defs(resources, mask_def=changed)
    for hours in (1, 3, 25):
        got = ev(T0 + timedelta(hours=hours))
        got.pop("corpus_summary", None)
        assert got == {}


def test_corpus_scope_launches_features_and_checks_only(instance, corpus, data_root, run_chain,
                                                         resources):
    """The default scope: a new or rewritten shard gets its features and checks, never a mask
    (the selection is the corpus stage's), and no catalog."""
    ev = Evaluator(instance, _defs(resources, scope="corpus"))
    assert ev(T0) == {}
    first = _tick(instance, data_root)
    _apply(instance, first)
    r = dg.evaluate_automation_conditions(ev.defs, instance, cursor=ev.cursor,
                                          evaluation_time=T0 + timedelta(minutes=1))
    ev.cursor = r.cursor
    assert sorted(r.get_requested_partitions(features.key)) == sorted(KEYS)
    checks = {k for k in ev.defs.resolve_asset_graph().asset_check_keys}
    got = {x.key: x.true_subset.size for x in r.results if x.key in checks}
    assert checks and got == {k: len(KEYS) for k in checks}  # the checks run with features
    assert all(r.get_num_requested(a.key) == 0 for a in SHARD_ASSETS[1:] + [corpus_summary])
    for key in KEYS:
        run_chain(key, selection=FEATURES_ONLY)
    assert ev(T0 + timedelta(minutes=2)) == {}
    pq.write_table(make_table(ROWS, dim=DIM, seed=42, id_offset=ROWS), data_root.raw_shard(KEYS[2]))
    stamp = time.time() + 30
    os.utime(data_root.raw_shard(KEYS[2]), (stamp, stamp))
    _apply(instance, _tick(instance, data_root, first.cursor))
    assert ev(T0 + timedelta(minutes=3)) == {"features": [KEYS[2]]}
    assert ev(T0 + timedelta(hours=2)) == {}  # no catalog, no mask, whatever the hour


def test_product_definitions_carry_the_automation(monkeypatch, resources):
    from datamask_pipeline import definitions

    graph = definitions.defs.resolve_asset_graph()
    # default scope: corpus, one automated key per shard
    assert automation.env_scope() == "corpus"
    assert graph.get(features.key).automation_condition.get_label().startswith("shard chain")
    for a in SHARD_ASSETS:
        assert graph.get(a.key).backfill_policy == automation.BACKFILL_POLICY
    for a in SHARD_ASSETS[1:] + [corpus_summary]:
        assert graph.get(a.key).automation_condition is None, a.key
    monkeypatch.setenv("DATAMASK_AUTOMATION", "per_shard")
    per_shard = dg.Definitions(assets=automation.automate(
        [raw_shard, features, mask, shard_report, selected_subset, corpus_summary]),
        asset_checks=[validate_features], resources=resources).resolve_asset_graph()
    for a in SHARD_ASSETS:
        assert per_shard.get(a.key).automation_condition.get_label().startswith("shard chain")
    assert per_shard.get(corpus_summary.key).automation_condition.get_label().startswith("catalog")
    monkeypatch.setenv("DATAMASK_AUTOMATION", "per-shard")
    with pytest.raises(ValueError, match="DATAMASK_AUTOMATION='per-shard': must be one of"):
        automation.env_scope()
    defs = definitions.defs
    sensor = defs.resolve_sensor_def(automation.AUTOMATION_SENSOR)
    assert isinstance(sensor, dg.AutomationConditionSensorDefinition)
    assert sensor.emit_backfills and sensor.default_status == dg.DefaultSensorStatus.STOPPED
    assert sensor.minimum_interval_seconds == 30


def test_automation_interval_is_a_setting(monkeypatch):
    monkeypatch.setenv("DATAMASK_AUTOMATION_INTERVAL_S", "180")
    assert automation.automation_sensor(FULL).minimum_interval_seconds == 180


# ---------------------------------------------------------------- the raw-shard sensor


def _tick(instance, data_root, cursor=None):
    # Called directly, as the daemon's evaluation does before it applies the partition requests.
    with dg.build_sensor_context(instance=instance, cursor=cursor,
                                 resources={"data_root": data_root}) as ctx:
        out = raw_shard_sensor(ctx)
    return dg.SensorResult(skip_reason=out) if isinstance(out, dg.SkipReason) else out


def _apply(instance, result):
    """What the daemon does with a sensor result: add partitions, record observations."""
    for req in result.dynamic_partitions_requests or []:
        instance.add_dynamic_partitions(req.partitions_def_name, list(req.partition_keys))
    for event in result.asset_events or []:
        instance.report_runless_asset_event(event)


def _signature(data_root, key):
    st = os.stat(data_root.raw_shard(key))
    return f"{st.st_size}:{st.st_mtime_ns}"


def _observed(instance, key):
    recs = instance.fetch_observations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("raw_shard"), asset_partitions=[key]),
        limit=1).records
    return recs[0].asset_observation.data_version if recs else None


def test_sensor_registers_and_observes_rewrites_but_launches_nothing(instance, corpus, data_root):
    shutil.copyfile(data_root.raw_shard(KEYS[0]), os.path.join(data_root.raw_root, "bad name.parquet"))
    first = _tick(instance, data_root)
    [add] = first.dynamic_partitions_requests
    assert add.partitions_def_name == PARTITIONS_NAME and list(add.partition_keys) == KEYS
    assert not first.run_requests  # automation launches, not this sensor
    assert not first.asset_events  # a new shard is newly missing: nothing to record
    _apply(instance, first)
    assert {k: _observed(instance, k) for k in KEYS} == {k: None for k in KEYS}

    second = _tick(instance, data_root, first.cursor)
    assert not second.asset_events and not second.dynamic_partitions_requests
    assert second.skip_reason.skip_message == "no new or rewritten shards"

    # a shard rewritten in place, and a new one dropped in
    later = time.time() + 60
    os.utime(data_root.raw_shard(KEYS[1]), (later, later))
    pq.write_table(make_table(ROWS, dim=DIM, seed=43, id_offset=9 * ROWS), data_root.raw_shard("shard_new"))
    third = _tick(instance, data_root, second.cursor)
    assert list(third.dynamic_partitions_requests[0].partition_keys) == ["shard_new"]
    assert [(e.partition, e.tags["dagster/data_version"]) for e in third.asset_events] == [
        (KEYS[1], _signature(data_root, KEYS[1]))]
    _apply(instance, third)
    assert _observed(instance, KEYS[1]) == _signature(data_root, KEYS[1])

    # a reset cursor records what it finds and re-launches nothing
    reset = _tick(instance, data_root, None)
    assert not reset.asset_events and not reset.dynamic_partitions_requests


def test_registered_shards_are_launched_without_an_observation(instance, corpus, data_root,
                                                                resources):
    """``register`` adds partitions and records no event; automation still launches them."""
    ev = Evaluator(instance, _defs(resources, scope="corpus"))
    assert ev(T0) == {}
    assert register_shards(instance, data_root.raw_root)["added"] == corpus
    assert {k: _observed(instance, k) for k in corpus} == {k: None for k in corpus}
    assert ev(T0 + timedelta(minutes=1)) == {"features": sorted(corpus)}


def test_observable_source_reports_every_registered_shard_from_one_listing(instance, registered,
                                                                           data_root):
    # what "Observe sources" in the UI launches: a job of the observable source
    job = dg.Definitions(assets=[raw_shard], resources={"data_root": data_root},
                         jobs=[dg.define_asset_job("observe_raw", [raw_shard])]
                         ).get_job_def("observe_raw")
    assert {k: _observed(instance, k) for k in registered} == {k: None for k in registered}
    assert job.execute_in_process(instance=instance).success
    assert {k: _observed(instance, k) for k in registered} == {
        k: _signature(data_root, k) for k in registered}


# ---------------------------------------------------------------- the dry run


def test_plan_follows_the_corpus_scope(registered, run_chain, instance, data_root):
    """The default scope: the dry run plans what automation launches, features only."""
    a, b, c = registered
    p = plan.plan(instance, data_root)
    assert p.scope == "corpus"
    assert p.reasons == {k: "missing: no features yet" for k in registered}
    text = plan.render(p)
    assert "need a run of features (automation scope corpus" in text
    assert "no device-hours" in text and p.gpu_hours is None
    for key in (a, b):
        run_chain(key, selection=FEATURES_ONLY)
    assert plan.plan(instance, data_root).reasons == {c: "missing: no features yet"}
    run_chain(c, selection=FEATURES_ONLY)
    assert plan.plan(instance, data_root).reasons == {}
    os.utime(data_root.raw_shard(b))  # rewritten after its ingestion (mtime = now)
    assert plan.plan(instance, data_root).reasons == {
        b: "stale: the raw shard was modified after ingestion"}


def test_plan_lists_missing_and_stale_shards_with_a_cost(registered, run_chain, instance, data_root,
                                                         monkeypatch):
    monkeypatch.setenv("DATAMASK_AUTOMATION", "per_shard")
    a, b, c = registered
    p = plan.plan(instance, data_root)
    assert p.reasons == {k: "missing: no selected subset yet" for k in registered}
    assert p.seconds_per_row is None and p.gpu_hours is None  # nothing measured yet
    assert "unknown" in plan.render(p)

    run_chain(a, selection=FULL, mask_config=None)
    run_chain(b, selection=FULL, mask_config=None)
    p = plan.plan(instance, data_root)
    assert p.reasons == {c: "missing: no selected subset yet"}
    # c was never ingested: its rows are estimated from its raw bytes; the rate is measured
    assert p.rows_estimated == [c] and abs(p.rows[c] - ROWS) <= ROWS * 0.2
    assert p.mask_runs_measured == 2 and p.seconds_per_row > 0
    assert p.gpu_hours == pytest.approx(p.rows[c] * p.seconds_per_row / 3600)

    run_chain(b, selection=FEATURES_ONLY)
    p = plan.plan(instance, data_root)
    assert p.reasons[b] == "stale: features were re-materialized after the mask"
    assert p.rows[b] == ROWS and b not in p.rows_estimated

    for key in p.reasons:
        run_chain(key, selection=FULL, mask_config=None)
    assert plan.plan(instance, data_root).reasons == {}
    os.utime(data_root.raw_shard(c))  # rewritten after its ingestion (mtime = now)
    assert plan.plan(instance, data_root).reasons == {
        c: "stale: the raw shard was modified after ingestion"}
    run_chain(c, selection=FULL, mask_config=None)
    instance.report_runless_asset_event(dg.AssetMaterialization(
        asset_key="selected_subset", partition=a, tags={"dagster/code_version": "selected-0"}))
    assert plan.plan(instance, data_root).reasons == {
        a: "stale: code version of selected_subset changed (selected-0 -> selected-1)"}
