"""The automation sensor, run by Dagster's own asset daemon (one iteration at a time, in this
process, at frozen times): the scheduled refresh creates ONE backfill of the missing shards."""

import os
from datetime import datetime, timedelta, timezone

import dagster as dg
from dagster._core.remote_origin import InProcessCodeLocationOrigin
from dagster._core.test_utils import create_test_daemon_workspace_context, freeze_time
from dagster._core.types.loadable_target_origin import LoadableTargetOrigin
from dagster._core.workspace.load_target import InProcessWorkspaceLoadTarget
from dagster._daemon.asset_daemon import AssetDaemon

from datamask_pipeline import automation

T0 = datetime(2026, 12, 3, 1, 0, tzinfo=timezone.utc)
DEFS_FILE = os.path.join(os.path.dirname(__file__), "automation_defs.py")


def _iterate(daemon, ctx, at):
    with freeze_time(at):
        daemon._run_iteration_impl(ctx, threadpool_executor=None, amp_tick_futures={},
                                   debug_crash_flags={})


def test_scheduled_refresh_creates_one_backfill_of_the_missing_shards(instance, registered):
    origin = InProcessCodeLocationOrigin(
        LoadableTargetOrigin(python_file=DEFS_FILE, attribute="defs",
                             working_directory=os.getcwd()), location_name="datamask")
    with create_test_daemon_workspace_context(InProcessWorkspaceLoadTarget([origin]),
                                              instance) as ctx:
        request = ctx.create_request_context()
        location = request.get_code_location("datamask")
        [repo] = location.get_repositories().values()
        sensor = repo.get_sensor(automation.AUTOMATION_SENSOR)
        instance.start_sensor(sensor)  # what "Start" in the UI does
        daemon = AssetDaemon(settings={}, pre_sensor_interval_seconds=0)

        _iterate(daemon, ctx, T0)  # first look: shards that were there before are not launched
        assert instance.get_backfills() == []
        _iterate(daemon, ctx, T0 + timedelta(hours=1))
        assert instance.get_backfills() == []
        _iterate(daemon, ctx, T0 + timedelta(hours=2, minutes=1))  # 03:00 passed
        [backfill] = instance.get_backfills()
        target = backfill.asset_backfill_data.target_subset
        by_asset = {k.to_user_string(): sorted(target.get_partitions_subset(k).get_partition_keys())
                    for k in target.asset_keys if k != dg.AssetKey("corpus_summary")}
        assert by_asset == {name: sorted(registered) for name in
                            ("features", "mask", "shard_report", "selected_subset")}
        _iterate(daemon, ctx, T0 + timedelta(hours=2, minutes=2))
        assert len(instance.get_backfills()) == 1  # in progress: not requested again
