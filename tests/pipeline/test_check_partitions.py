"""Per-shard check results: the validation checks are partitioned like ``features``, so the
instance keeps one result per check per shard. A bad shard's records name its rule and ids,
the good shards' records of the same checks stay passed, the bad shard's blocking failure
stops only its own mask step, and re-running it after a fix flips only its own records."""

import os

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from assets.validate import CHECKS, latest_check_records, latest_check_status

BAD = 1  # the middle shard: neither the first nor the last run is the bad one
DUPLICATED = [20, 40]  # ids copied onto the next row


def _duplicate_ids(table: pa.Table) -> pa.Table:
    ids = table.column("chunk_id").to_numpy().copy()
    for i in DUPLICATED:
        ids[i + 1] = ids[i]
    return table.set_column(table.schema.get_field_index("chunk_id"), "chunk_id", pa.array(ids))


def _mask_partitions(instance) -> set:
    return instance.get_materialized_partitions(dg.AssetKey("mask"))


def _step_events(result, step: str) -> set:
    return {e.event_type_value for e in result.all_events if e.step_key == step}


def test_check_results_are_recorded_per_shard(registered, instance, data_root, run_chain):
    keys = registered
    bad = keys[BAD]
    raw_path = data_root.raw_shard(bad)
    original = pq.read_table(raw_path)
    broken = _duplicate_ids(original)
    dup_ids = [broken.column("chunk_id")[i].as_py() for i in DUPLICATED]
    pq.write_table(broken, raw_path)

    results = {k: run_chain(k, raise_on_error=False) for k in keys}
    assert not results[bad].success
    assert all(results[k].success for k in keys if k != bad)

    # 1. per shard, from the instance: the bad shard's unique_ids failed with rule and ids ...
    status = latest_check_status(instance)
    assert set(status) == set(keys)
    assert status[bad] == {**{n: "SUCCEEDED" for n in CHECKS}, "unique_ids": "FAILED"}
    for k in keys:
        if k != bad:
            assert status[k] == {n: "SUCCEEDED" for n in CHECKS}, (k, status[k])

    assert latest_check_status(instance, [bad]) == {bad: status[bad]}
    records = {k: latest_check_records(instance, k) for k in keys}
    failed = records[bad]["unique_ids"]
    assert failed.partition == bad and failed.run_id == results[bad].run_id
    ev = failed.evaluation
    assert not ev.passed and ev.partition == bad
    assert f"partition '{bad}'" in ev.description and raw_path in ev.description
    assert "rule 'unique ids' broken by 2 rows" in ev.description
    assert f"ids: {dup_ids}" in ev.description, ev.description
    assert ev.metadata["rules_broken"].value == ["unique ids"]
    assert ev.metadata["offending_ids"].value == dup_ids
    assert ev.metadata["partition"].value == bad
    # ... while the same check's records of the good shards say passed, each for its own run
    for k in keys:
        if k == bad:
            continue
        rec = records[k]["unique_ids"]
        assert rec.partition == k and rec.run_id == results[k].run_id
        assert rec.evaluation.passed and "offending_ids" not in rec.evaluation.metadata
        assert all(r.evaluation.passed for r in records[k].values())
        assert set(records[k]) == set(CHECKS)

    # 2. blocking, per shard: the bad shard's mask step never started, the good shards' ran
    failure = [e for e in results[bad].all_events if e.is_step_failure]
    assert [e.step_key for e in failure] == ["validate_features"]
    assert "blocking asset check failed" in failure[0].step_failure_data.error.message
    assert "features: unique_ids" in failure[0].step_failure_data.error.message
    assert not _step_events(results[bad], "mask") and not _step_events(results[bad], "selected_subset")
    for k in keys:
        if k != bad:
            assert "STEP_SUCCESS" in _step_events(results[k], "mask")
    assert _mask_partitions(instance) == {k for k in keys if k != bad}
    assert [os.path.exists(data_root.mask(k)) for k in keys] == [k != bad for k in keys]

    # 3. fix the raw file and re-run the bad shard: only its records flip to passed
    before = {k: {n: r.id for n, r in records[k].items()} for k in keys if k != bad}
    pq.write_table(original, raw_path)
    rerun = run_chain(bad)
    assert rerun.success
    status = latest_check_status(instance)
    assert all(s == {n: "SUCCEEDED" for n in CHECKS} for s in status.values()), status
    fixed = latest_check_records(instance, bad)
    assert {r.run_id for r in fixed.values()} == {rerun.run_id}
    assert all(r.evaluation.passed and r.partition == bad for r in fixed.values())
    after = {k: {n: r.id for n, r in latest_check_records(instance, k).items()}
             for k in keys if k != bad}
    assert after == before  # the good shards' records were not touched
    assert _mask_partitions(instance) == set(keys)
    # the failed result of the first run is kept in the bad shard's history
    history = instance.event_log_storage.get_asset_check_execution_history(
        dg.AssetCheckKey(dg.AssetKey("features"), "unique_ids"), limit=10)
    by_partition = [(r.partition, r.evaluation.passed) for r in history]
    assert by_partition.count((bad, False)) == 1 and by_partition.count((bad, True)) == 1
    assert np.array_equal(pq.read_table(data_root.features(bad)).column("id").to_numpy(),
                          original.column("chunk_id").to_numpy())


# The two queries the UI's Checks tab sends for a partitioned check (copied from the
# dagster-webserver 1.13 bundle, trimmed to the fields asserted): the per-shard status grid and
# the selected shard's latest execution.
UI_HEALTH = """
query ($assetKey: AssetKeyInput!, $checkName: String!) {
  assetNodeOrError(assetKey: $assetKey) { __typename ... on AssetNotFoundError { message }
                                          ... on AssetNode {
    assetCheckOrError(checkName: $checkName) { ... on AssetCheck {
      partitionKeysByDimension { partitionKeys }
      partitionStatuses { ... on AssetCheckDefaultPartitionStatuses {
        succeededPartitions failedPartitions } } } } } }
}"""
UI_DETAIL = """
query ($assetKey: AssetKeyInput!, $checkName: String!, $partitionKey: String!) {
  assetCheckExecutions(assetKey: $assetKey, checkName: $checkName, partition: $partitionKey,
                       limit: 1000) {
    runId status
    evaluation { success partition description
                 metadataEntries { label ... on JsonMetadataEntry { jsonString } } } }
}"""


def _ui_context(instance):
    """A GraphQL request context over the project's definitions, as ``dagster dev`` serves."""
    import sys

    from dagster._core.remote_origin import InProcessCodeLocationOrigin
    from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
    from dagster._core.workspace.context import WorkspaceProcessContext
    from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget

    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(executable_path=sys.executable, attribute="defs",
                             module_name="datamask_pipeline.definitions"),
        location_name="datamask")
    return WorkspaceProcessContext(instance, InProcessWorkspaceLoadTarget(origin))


def test_ui_checks_tab_shows_each_shard(registered, instance, data_root, run_chain):
    """What the UI's Checks tab queries shows, per shard, which one failed which rule with
    which ids."""
    import json

    from dagster_graphql.test.utils import execute_dagster_graphql

    keys = registered
    bad = keys[BAD]
    broken = _duplicate_ids(pq.read_table(data_root.raw_shard(bad)))
    dup_ids = [broken.column("chunk_id")[i].as_py() for i in DUPLICATED]
    pq.write_table(broken, data_root.raw_shard(bad))
    for k in keys:
        run_chain(k, selection=dg.AssetSelection.assets("features"), raise_on_error=False)

    asset = {"path": ["features"]}
    # entered as the webserver enters it for every request (it scopes dynamic partitions)
    with _ui_context(instance) as process_context, process_context.create_request_context() as ctx:
        data = execute_dagster_graphql(
            ctx, UI_HEALTH, {"assetKey": asset, "checkName": "unique_ids"}).data
        assert "assetCheckOrError" in data["assetNodeOrError"], data
        node = data["assetNodeOrError"]["assetCheckOrError"]
        assert node["partitionKeysByDimension"][0]["partitionKeys"] == keys
        statuses = node["partitionStatuses"]
        assert statuses["failedPartitions"] == [bad]
        assert sorted(statuses["succeededPartitions"]) == [k for k in keys if k != bad]

        for k in keys:
            execs = execute_dagster_graphql(
                ctx, UI_DETAIL, {"assetKey": asset, "checkName": "unique_ids", "partitionKey": k}
            ).data["assetCheckExecutions"]
            assert len(execs) == 1
            ev = execs[0]["evaluation"]
            assert ev["partition"] == k
            assert execs[0]["status"] == ("FAILED" if k == bad else "SUCCEEDED")
            meta = {m["label"]: m.get("jsonString") for m in ev["metadataEntries"]}
            if k == bad:
                assert not ev["success"]
                assert "rule 'unique ids' broken by 2 rows" in ev["description"]
                assert json.loads(meta["offending_ids"]) == dup_ids
                assert json.loads(meta["rules_broken"]) == ["unique ids"]
            else:
                assert ev["success"] and "offending_ids" not in meta


def test_checks_are_partitioned_like_features_without_preview_noise():
    """Every check spec carries the ``shards`` partitions; importing the module prints none of
    the per-spec preview warnings Dagster 1.13 emits for them (silenced narrowly)."""
    import subprocess
    import sys

    from assets.ingest import features
    from assets.partitions import shards
    from assets.validate import validate_features

    specs = list(validate_features.check_specs)
    assert {s.name for s in specs} == set(CHECKS)
    assert all(s.partitions_def == shards == features.partitions_def and s.blocking for s in specs)

    code = ("import warnings, dagster as dg; warnings.simplefilter('always', dg.PreviewWarning); "
            "import assets.validate")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert out.returncode == 0, out.stderr
    assert "partitions_def on an AssetCheckSpec" not in out.stderr, out.stderr
