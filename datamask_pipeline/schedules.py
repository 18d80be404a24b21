"""The corpus schedule: the corpus selection on a cron, on by default, and only when it is due.

``corpus_schedule`` targets ``corpus_job`` (``corpus_dedup`` -> ``corpus_selection`` ->
``corpus_subset``) at each tick of ``DATAMASK_CORPUS_CRON`` (default ``0 0 * * *``: daily at
00:00 UTC; ``off``: no schedule). Its status is RUNNING by default: the daemon (``dagster dev``
starts one) evaluates it without anyone turning it on, and the UI's Automation page shows it,
where it can be stopped.

At a tick it launches the job only when the dry run's corpus plan
(:func:`datamask_pipeline.plan.corpus_plan`) says the selection is due: shards new or
re-ingested since the last ``corpus_selection``, or shards of the last selection gone, or no
selection yet while some shard passed its checks. It skips while a shard is in progress (a run
of ``features`` queued or running, or a requested backfill that has not materialized it yet) or
a corpus selection is still running, and says why in the tick's skip reason. The schedule and
``python -m datamask_pipeline.plan`` apply one rule, so the dry run says what the next tick will
do, and when it fires (:func:`describe`).

The per-shard refresh (``DATAMASK_REFRESH_CRON``) is automation's, and stays opt-in.
"""

from __future__ import annotations

import datetime as _dt
import time

import dagster as dg

from resources.storage import DataRoot

from . import automation, plan
from .jobs import corpus_job

CORPUS_SCHEDULE = "corpus_schedule"
TIMEZONE = "UTC"


def evaluate(instance: dg.DagsterInstance, data_root: DataRoot):
    """What the schedule does at a tick: a ``dg.RunRequest`` of ``corpus_job`` when the corpus
    plan is due, else a ``dg.SkipReason`` with the plan's words."""
    c = plan.corpus_plan(instance, data_root)
    if c["due"]:
        return dg.RunRequest(tags={plan.LAUNCH_TAG: CORPUS_SCHEDULE})
    return dg.SkipReason(plan.render_corpus(c, limit=5))


def corpus_schedule(cron: str) -> dg.ScheduleDefinition:
    @dg.schedule(
        name=CORPUS_SCHEDULE,
        cron_schedule=cron,
        job=corpus_job,
        execution_timezone=TIMEZONE,
        default_status=dg.DefaultScheduleStatus.RUNNING,
        description=f"The corpus selection (corpus_job) at {cron} ({TIMEZONE}; env "
        "DATAMASK_CORPUS_CRON), only when shards changed since the last corpus_selection and "
        "none is in progress; the skip reason says why not (datamask_pipeline/schedules.py).",
    )
    def _corpus_schedule(context: dg.ScheduleEvaluationContext, data_root: DataRoot):
        return evaluate(context.instance, data_root)

    return _corpus_schedule


def schedules_from_env() -> list:
    """``[corpus_schedule]`` at ``DATAMASK_CORPUS_CRON`` (default daily), none when ``off``."""
    cron = automation.corpus_cron()
    return [corpus_schedule(cron)] if cron else []


def next_tick(cron: str, now: float | None = None) -> _dt.datetime:
    """The schedule's next tick after ``now`` (default: now), in ``TIMEZONE``."""
    from dagster._utils.schedules import cron_string_iterator

    now = time.time() if now is None else now
    for tick in cron_string_iterator(now, cron, TIMEZONE):
        if tick.timestamp() > now:
            return tick
    raise ValueError(cron)  # pragma: no cover - the iterator never ends


def stopped(instance: dg.DagsterInstance) -> bool:
    """Whether the schedule was stopped (UI or CLI): the instance stores a STOPPED state."""
    from dagster._core.scheduler.instigation import InstigatorStatus, InstigatorType

    return any(s.instigator_name == CORPUS_SCHEDULE and s.status == InstigatorStatus.STOPPED
               for s in instance.all_instigator_state(instigator_type=InstigatorType.SCHEDULE))


def describe(instance: dg.DagsterInstance, now: float | None = None) -> str:
    """One line for the dry run: when the corpus schedule next fires, or why it does not."""
    cron = automation.corpus_cron()
    if cron is None:
        return (f"corpus schedule: off (DATAMASK_CORPUS_CRON=off): launch corpus_job yourself "
                "(dagster job launch -j corpus_job)")
    if stopped(instance):
        return (f"corpus schedule ({CORPUS_SCHEDULE}, {cron} {TIMEZONE}): stopped on this "
                "instance; it fires again once started (UI: Automation, or dagster schedule "
                f"start {CORPUS_SCHEDULE})")
    now = time.time() if now is None else now
    tick = next_tick(cron, now)
    hours = (tick.timestamp() - now) / 3600.0
    return (f"corpus schedule ({CORPUS_SCHEDULE}, {cron} {TIMEZONE}, DATAMASK_CORPUS_CRON): "
            f"next fires {tick:%Y-%m-%d %H:%M} {TIMEZONE} (in {hours:.1f} h), and launches "
            "corpus_job then only if it is due and no shard is in progress; the daemon runs it "
            "(dagster dev, or dagster-daemon run)")
