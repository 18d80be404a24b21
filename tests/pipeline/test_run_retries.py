"""Issue 20, item 1: run retries (dagster.yaml, deploy/dagster.yaml) never re-run a failed step.

Dagster decides when a run fails whether the daemon will retry it, and records it as the run
tag ``dagster/will_retry``. With the instance settings of both files:

* a failed blocking check and a ``Failure(allow_retries=False)`` give ``will_retry=false``;
* a transient I/O error is retried inside the run (``retry_transient_io``, 3 attempts at most),
  a path error of the mask step is not retried at all, and neither failed run is retried
  again (it was 6 attempts);
* a run that died around its steps (the run worker restarted) is still retried once.
"""

import os
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest
import yaml

from assets.ingest import TRANSIENT_MAX_RETRIES, retry_transient_io
from assets.learn import MaskConfig, mask
from assets.partitions import register_shards
from datamask_pipeline.engine.sample import make_table

from .helpers import ALL_ASSETS, CHAIN, DIM, ROWS, TINY

REPO = Path(__file__).resolve().parents[2]
WILL_RETRY = "dagster/will_retry"


def _run_retries(path: str) -> dict:
    with open(REPO / path) as fh:
        return yaml.safe_load(fh)["run_retries"]


@pytest.fixture(params=["dagster.yaml", "deploy/dagster.yaml"])
def retrying_instance(request, tmp_path):
    """A temporary instance with the run-retry settings of one of the repository's files."""
    (tmp_path / "home").mkdir()
    with dg.instance_for_test(temp_dir=str(tmp_path / "home"),
                              overrides={"run_retries": _run_retries(request.param)}) as inst:
        yield inst


def _tag(instance, result) -> str | None:
    return instance.get_run_by_id(result.run_id).tags.get(WILL_RETRY)


def test_both_instance_files_retry_runs_but_not_failed_steps(retrying_instance):
    assert retrying_instance.run_retries_enabled
    assert retrying_instance.run_retries_max_retries == 1
    assert retrying_instance.run_retries_retry_on_asset_or_op_failure is False


def test_a_failed_blocking_check_or_a_no_retry_failure_is_not_run_again(
        retrying_instance, data_root, resources):
    inst = retrying_instance
    os.makedirs(data_root.raw_root, exist_ok=True)
    table = make_table(ROWS, dim=DIM, seed=9)
    ids = table.column("chunk_id").to_pylist()
    ids[1] = ids[0]  # duplicated id: the blocking check 'unique ids' fails
    pq.write_table(table.set_column(0, "chunk_id", [ids]), data_root.raw_shard("bad"))
    pq.write_table(make_table(ROWS, dim=DIM, seed=10), data_root.raw_shard("good"))
    register_shards(inst, data_root.raw_root)

    def run(key, **cfg):
        return dg.materialize(ALL_ASSETS, partition_key=key, instance=inst, resources=resources,
                              selection=CHAIN, raise_on_error=False,
                              run_config=dg.RunConfig({"mask": MaskConfig(**{**TINY, **cfg})}))

    checked = run("bad")
    assert not checked.success
    assert not [e for e in checked.all_events if e.is_step_success and e.step_key == "mask"]
    assert _tag(inst, checked) == "false"

    # an impossible config: the mask step raises Failure(allow_retries=False)
    refused = run("good", solver="paper", partial=0.001)
    assert not refused.success
    assert not [e for e in refused.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert _tag(inst, refused) == "false"


def test_a_path_error_in_the_mask_step_is_not_retried_in_the_run_nor_by_a_new_run(
        retrying_instance, data_root, resources):
    inst = retrying_instance
    os.makedirs(data_root.raw_root, exist_ok=True)
    pq.write_table(make_table(ROWS, dim=DIM, seed=11), data_root.raw_shard("s"))
    register_shards(inst, data_root.raw_root)
    # the mask file cannot be published (its path is a directory): the next attempt would
    # meet the same directory, so it is not transient (was: retried twice by a RetryPolicy)
    os.makedirs(os.path.join(data_root.mask("s"), "in_the_way"))
    assert mask.op.retry_policy is None

    result = dg.materialize(ALL_ASSETS, partition_key="s", instance=inst, resources=resources,
                            selection=CHAIN, raise_on_error=False,
                            run_config=dg.RunConfig({"mask": MaskConfig(**TINY)}))
    assert not result.success
    assert [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"] == []
    failure = [e for e in result.all_events if e.is_step_failure][0]
    assert failure.step_key == "mask" and "is a directory" in failure.step_failure_data.error.to_string()
    assert _tag(inst, result) == "false"  # ... and no second run repeats it


def test_a_transient_error_is_retried_in_the_run_and_not_by_a_new_run(retrying_instance):
    @dg.asset(name="probe")
    @retry_transient_io(seconds_to_wait=0)
    def probe():
        raise TimeoutError("the object store did not answer")

    result = dg.materialize([probe], instance=retrying_instance, raise_on_error=False)
    retried = [e.step_key for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert retried == ["probe"] * TRANSIENT_MAX_RETRIES  # 3 attempts in the run
    assert _tag(retrying_instance, result) == "false"  # ... and no second run repeats them


def test_a_run_whose_worker_died_is_still_retried(retrying_instance):
    @dg.op
    def noop():
        return None

    @dg.job
    def some_job():
        noop()

    inst = retrying_instance
    run = inst.create_run_for_job(some_job, tags={"dagster/failure_reason": "RUN_WORKER_RESTART"})
    inst.report_run_failed(run)
    assert inst.get_run_by_id(run.run_id).tags.get(WILL_RETRY) == "true"
