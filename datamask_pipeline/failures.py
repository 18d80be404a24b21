"""Failed shards, reported: a run-failure sensor that names the partition and the reason (the
failed step's own error) in its log, as the ``datamask/failure`` tag on the failed run, and,
when ``DATAMASK_FAILURE_WEBHOOK`` is set, as a JSON POST to that URL.

A failed run that Dagster is about to retry (the instance's ``run_retries``; Dagster tags it
``dagster/will_retry=true`` when it fails) is not reported: only the last attempt is, when it
fails too. Dagster's ready-made run-failure sensors (``make_email_on_run_failure_sensor``,
dagster-slack's ``make_slack_on_run_failure_sensor``, dagster-msteams') report every failed run,
retried ones included, and add one dependency per channel; one generic webhook needs neither.
"""

import json
import os
import urllib.request

import dagster as dg

from datamask_pipeline import settings

FAILURE_TAG = "datamask/failure"
WILL_RETRY_TAG = "dagster/will_retry"  # set by Dagster on a failed run when run retries are on
REASON_CHARS = 500  # the tag keeps the head of long errors; the run log has the whole one


def failure_reason(context: dg.RunFailureSensorContext) -> str:
    """The first failed step's error (what broke, in the step's own words), else the run's."""
    for event in context.get_step_failure_events():
        err = event.step_failure_data.error if event.step_failure_data else None
        if err is not None and err.message:
            return f"step {event.step_key}: {err.message.strip()}"
    return (context.failure_event.message or "run failed").strip()


def post_webhook(url: str, payload: dict, timeout_s: float = 10.0) -> None:
    """POST ``payload`` as JSON to an http(s) URL (raises OSError/ValueError on failure)."""
    if not url.lower().startswith(("http://", "https://")):
        raise ValueError(f"{settings.ENV_FAILURE_WEBHOOK} must be an http(s) URL, got {url!r}")
    req = urllib.request.Request(url, data=json.dumps(payload).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310 (http(s) only)
        resp.read()


def will_be_retried(instance: dg.DagsterInstance, run: dg.DagsterRun) -> bool:
    """Whether Dagster's run retries will re-execute this failed run (its ``dagster/will_retry``
    tag, read from the instance: the tag is added after the failure is stored)."""
    current = instance.get_run_by_id(run.run_id) or run
    return str(current.tags.get(WILL_RETRY_TAG, "")).strip().lower() == "true"


@dg.run_failure_sensor(
    name="shard_failure_sensor",
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Reports every failed run that will not be retried (no dagster/will_retry=true "
    "tag): the shard (partition) and the failed step's error, "
    f"in the sensor's log, as the '{FAILURE_TAG}' tag on the run, and to the webhook "
    f"{settings.ENV_FAILURE_WEBHOOK} when set.",
)
def shard_failure_sensor(context: dg.RunFailureSensorContext):
    run = context.dagster_run
    shard = run.tags.get("dagster/partition") or "(no partition)"
    if will_be_retried(context.instance, run):
        context.log.info(f"shard {shard}: run {run.run_id} ({run.job_name}) failed and will be "
                         "retried (run_retries): reported only if the retry fails too")
        return
    reason = failure_reason(context)
    context.log.error(f"shard {shard}: run {run.run_id} ({run.job_name}) failed: {reason}")
    context.instance.add_run_tags(run.run_id, {FAILURE_TAG: reason[:REASON_CHARS]})
    url = os.environ.get(settings.ENV_FAILURE_WEBHOOK)
    if url:
        payload = {"shard": shard, "run_id": run.run_id, "job": run.job_name, "reason": reason}
        try:
            post_webhook(url, payload)
        except (OSError, ValueError) as exc:  # a dead webhook must not stop the reporting
            context.log.warning(f"failure webhook {url} not reached: {exc}")
