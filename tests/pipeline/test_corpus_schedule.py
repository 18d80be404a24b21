"""Issue 26, point 10: the corpus selection is scheduled by default, safely.

``corpus_schedule`` (``datamask_pipeline/schedules.py``) is in the definitions (the UI shows
it), RUNNING by default, at ``DATAMASK_CORPUS_CRON`` (default daily). Dagster's own scheduler
(the daemon's iteration, run here in this process at frozen times, with no "start" of the
schedule) launches ``corpus_job`` at a tick only when shards changed since the last selection
and no shard is in progress, and records why it skipped otherwise. The per-shard refresh
(``DATAMASK_REFRESH_CRON``) stays opt-in, and the dry run says when the schedule next fires.
"""

import logging
import os
from datetime import datetime, timedelta, timezone

import dagster as dg
import pytest
from dagster._core.execution.backfill import BulkActionStatus
from dagster._core.scheduler.instigation import TickStatus
from dagster._core.test_utils import freeze_time

from datamask_pipeline import automation, plan, schedules
from datamask_pipeline.plan import cli as plan_cli

from .helpers import KEYS
from .test_plan_operator import (QUEUED, corpus_run, features_of, rewrite,  # noqa: F401
                                 queued_instance, workspace)

DAY = timedelta(days=1)


def test_the_schedule_is_in_the_definitions_running_by_default(monkeypatch):
    from datamask_pipeline.definitions import make_defs

    monkeypatch.delenv("DATAMASK_CORPUS_CRON", raising=False)
    monkeypatch.delenv("DATAMASK_REFRESH_CRON", raising=False)
    defs = make_defs()
    s = defs.resolve_schedule_def(schedules.CORPUS_SCHEDULE)
    assert s.cron_schedule == "0 0 * * *" and s.execution_timezone == "UTC"
    assert s.default_status == dg.DefaultScheduleStatus.RUNNING  # scheduled without a click
    assert s.job_name == "corpus_job"
    # the per-shard refresh stays opt-in: no cron in the shard condition
    assert automation.refresh_cron() is None
    cond = defs.resolve_asset_graph().get(dg.AssetKey("features")).automation_condition
    assert "refresh" not in cond.get_label()

    monkeypatch.setenv("DATAMASK_CORPUS_CRON", "30 6 * * 1")
    assert make_defs().resolve_schedule_def(schedules.CORPUS_SCHEDULE).cron_schedule == "30 6 * * 1"
    monkeypatch.setenv("DATAMASK_CORPUS_CRON", "off")
    assert not list(make_defs().schedules or [])
    assert "off" in schedules.describe(None)
    monkeypatch.setenv("DATAMASK_CORPUS_CRON", "every day")
    with pytest.raises(ValueError, match="DATAMASK_CORPUS_CRON='every day': not a cron string"):
        make_defs()


def test_the_dry_run_says_when_the_schedule_next_fires(instance, monkeypatch):
    monkeypatch.delenv("DATAMASK_CORPUS_CRON", raising=False)
    now = datetime(2026, 12, 5, 11, 0, tzinfo=timezone.utc).timestamp()
    line = plan_cli.schedule_line(instance, now=now)
    assert "next fires 2026-12-06 00:00 UTC (in 13.0 h)" in line
    monkeypatch.setenv("DATAMASK_CORPUS_CRON", "0 3 * * *")
    assert "next fires 2026-12-06 03:00 UTC (in 16.0 h)" in plan_cli.schedule_line(instance, now=now)


def _scheduler(ctx, at):
    """One iteration of Dagster's scheduler daemon at ``at`` (frozen)."""
    import dagster._daemon  # noqa: F401  (import order of the daemon modules)
    from dagster._scheduler.scheduler import launch_scheduled_runs

    with freeze_time(at):
        list(launch_scheduled_runs(ctx, logging.getLogger("scheduler"), end_datetime_utc=at,
                                   iteration_times={}))


def _corpus_runs(instance) -> list:
    return instance.get_runs(filters=dg.RunsFilter(job_name="corpus_job"))


def test_the_scheduler_launches_the_corpus_job_only_when_due(
        queued_instance, corpus, data_root, resources, monkeypatch, capsys):
    inst = queued_instance
    monkeypatch.delenv("DATAMASK_CORPUS_CRON", raising=False)
    from assets.partitions import register_shards

    register_shards(inst, data_root.raw_root)
    start = datetime.now(timezone.utc).replace(hour=12, minute=0, second=0, microsecond=0)

    with workspace(inst) as ctx:
        [repo] = ctx.create_request_context().get_code_location("datamask") \
            .get_repositories().values()
        remote = repo.get_schedule(schedules.CORPUS_SCHEDULE)

        def tick(day):
            """The scheduler just after midnight of ``day``; the tick it recorded."""
            _scheduler(ctx, start + day * DAY + timedelta(hours=12, minutes=1))
            ticks = inst.get_ticks(remote.get_remote_origin_id(), remote.selector_id)
            return ticks[0]

        _scheduler(ctx, start)  # first look: the schedule is running, no tick due yet
        assert _corpus_runs(inst) == []

        # registered shards without features: nothing to select from
        t = tick(0)
        assert t.status == TickStatus.SKIPPED and "has features that passed" in t.skip_reason
        assert _corpus_runs(inst) == []

        # features for every shard, no selection yet: due, one corpus_job run is launched
        for key in KEYS:
            features_of(inst, resources, key)
        t = tick(1)
        assert t.status == TickStatus.SUCCESS
        [run] = _corpus_runs(inst)
        assert run.tags[plan.LAUNCH_TAG] == schedules.CORPUS_SCHEDULE
        assert run.status == dg.DagsterRunStatus.QUEUED  # no queue daemon here

        # while that selection is queued: not launched again
        t = tick(2)
        assert t.status == TickStatus.SKIPPED and "a corpus selection is running" in t.skip_reason
        assert len(_corpus_runs(inst)) == 1

        # the selection done (in this process; the queued run given up): nothing changed since
        inst.report_run_canceled(run)
        corpus_run(inst, resources)
        t = tick(3)
        assert t.status == TickStatus.SKIPPED and "up to date" in t.skip_reason

        # a shard changed and relaunched as a backfill (in progress): the selection waits
        rewrite(data_root, KEYS[0], 31)
        assert plan_cli.main(["--launch"], instance=inst) == 0
        t = tick(4)
        assert t.status == TickStatus.SKIPPED
        assert "waits: 1 shard(s) in progress" in t.skip_reason
        assert len(_corpus_runs(inst)) == 1  # the first tick's (the selection ran in-process)

        # the backfill gave up, the shard re-ingested by hand: changed, none in progress: due
        [backfill] = inst.get_backfills()
        inst.update_backfill(backfill.with_status(BulkActionStatus.CANCELED))
        features_of(inst, resources, KEYS[0])
        t = tick(5)
        assert t.status == TickStatus.SUCCESS, t.skip_reason
        assert len(_corpus_runs(inst)) == 2

    rc = plan_cli.main([], instance=inst)
    out = capsys.readouterr().out
    assert rc == 0 and "corpus schedule (corpus_schedule, 0 0 * * * UTC" in out
    assert "next fires" in out
    assert os.path.exists(data_root.corpus_dir())
