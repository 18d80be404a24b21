"""Failed shards, reported: a run-failure sensor that names the partition and the reason (the
failed step's own error) in its log, as the ``datamask/failure`` tag on the failed run, and,
when ``DATAMASK_FAILURE_WEBHOOK`` is set, as a JSON POST to that URL.
"""

import json
import os
import urllib.request

import dagster as dg

from datamask_pipeline import settings

FAILURE_TAG = "datamask/failure"
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


@dg.run_failure_sensor(
    name="shard_failure_sensor",
    default_status=dg.DefaultSensorStatus.RUNNING,
    description="Reports every failed run: the shard (partition) and the failed step's error, "
    f"in the sensor's log, as the '{FAILURE_TAG}' tag on the run, and to the webhook "
    f"{settings.ENV_FAILURE_WEBHOOK} when set.",
)
def shard_failure_sensor(context: dg.RunFailureSensorContext):
    run = context.dagster_run
    shard = run.tags.get("dagster/partition") or "(no partition)"
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
