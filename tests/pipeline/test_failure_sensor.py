"""A failed shard is reported by shard_failure_sensor: its reason in the sensor log, as a tag on
the failed run, and as a JSON POST to the webhook (a real HTTP server on 127.0.0.1)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import dagster as dg
import pytest

from datamask_pipeline.failures import FAILURE_TAG, shard_failure_sensor


@pytest.fixture
def webhook():
    received = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append(json.loads(body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", received
    server.shutdown()
    server.server_close()


def _evaluate(instance, result):
    run = instance.get_run_by_id(result.run_id)
    failure = [e for e in result.all_events if e.event_type == dg.DagsterEventType.RUN_FAILURE][0]
    ctx = dg.build_run_status_sensor_context(
        sensor_name="shard_failure_sensor", dagster_instance=instance, dagster_run=run,
        dagster_event=failure).for_run_failure()
    shard_failure_sensor(ctx)
    return instance.get_run_by_id(result.run_id)


def test_failed_shard_is_tagged_and_posted(registered, run_chain, instance, webhook, monkeypatch):
    url, received = webhook
    monkeypatch.setenv("DATAMASK_FAILURE_WEBHOOK", url)
    key = registered[1]
    result = run_chain(key, raise_on_error=False, solver="paper", partial=0.001)
    assert not result.success
    run = _evaluate(instance, result)
    tag = run.tags[FAILURE_TAG]
    # the impossible size is refused by the run's first step, before anything is written
    assert tag.startswith("step features:") and f"partition '{key}'" in tag and "partial=0.001" in tag
    assert received == [{"shard": key, "run_id": result.run_id, "job": run.job_name,
                         "reason": received[0]["reason"]}]
    assert received[0]["reason"].startswith(tag)


def test_an_unreachable_webhook_does_not_stop_the_report(registered, run_chain, instance,
                                                         monkeypatch):
    monkeypatch.setenv("DATAMASK_FAILURE_WEBHOOK", "http://127.0.0.1:9/nothing-listens-here")
    result = run_chain(registered[0], raise_on_error=False, solver="paper", partial=0.001)
    run = _evaluate(instance, result)
    assert "partial=0.001" in run.tags[FAILURE_TAG]


def test_sensor_is_in_the_definitions_and_running_by_default():
    from datamask_pipeline.definitions import defs

    sensor = defs.resolve_sensor_def("shard_failure_sensor")
    assert sensor.default_status == dg.DefaultSensorStatus.RUNNING
