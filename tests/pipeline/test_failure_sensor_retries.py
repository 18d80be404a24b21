"""Issue 20, item 2: shard_failure_sensor reports a failed run only when Dagster will not
retry it (the run tag ``dagster/will_retry``, set by Dagster when run retries are on).

The instance here has run retries that also retry step failures, so Dagster itself tags the
first failure ``will_retry=true``; its last attempt (no retries left) is tagged ``false``."""

import tempfile

import dagster as dg
import pytest

from datamask_pipeline.failures import FAILURE_TAG, WILL_RETRY_TAG

from .test_failure_sensor import _evaluate, webhook  # noqa: F401 (a fixture)


@pytest.fixture
def instance():
    """Replaces conftest's instance: run retries on, step failures included."""
    with tempfile.TemporaryDirectory(prefix="datamask-dagster-home-") as home:
        with dg.instance_for_test(temp_dir=home, overrides={"run_retries": {
                "enabled": True, "max_retries": 1, "retry_on_asset_or_op_failure": True}}) as inst:
            yield inst


def test_a_run_that_will_be_retried_is_not_reported(registered, run_chain, instance, webhook,
                                                     monkeypatch):
    url, received = webhook
    monkeypatch.setenv("DATAMASK_FAILURE_WEBHOOK", url)
    key = registered[0]
    result = run_chain(key, raise_on_error=False, solver="paper", partial=0.001)
    assert not result.success
    assert instance.get_run_by_id(result.run_id).tags[WILL_RETRY_TAG] == "true"  # Dagster's
    run = _evaluate(instance, result)
    assert FAILURE_TAG not in run.tags
    assert received == []


def test_the_last_attempt_is_reported(registered, run_chain, instance, webhook, monkeypatch):
    url, received = webhook
    monkeypatch.setenv("DATAMASK_FAILURE_WEBHOOK", url)
    key = registered[1]
    result = run_chain(key, raise_on_error=False, solver="paper", partial=0.001)
    # what Dagster records when no retry is left (or run retries are off for this failure)
    instance.add_run_tags(result.run_id, {WILL_RETRY_TAG: "false"})
    run = _evaluate(instance, result)
    assert "partial=0.001" in run.tags[FAILURE_TAG]
    assert [r["shard"] for r in received] == [key]
