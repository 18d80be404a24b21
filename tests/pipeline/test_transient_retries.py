"""Issue 26, point 4: retries cover transient I/O only.

No asset carries a ``dg.RetryPolicy`` (Dagster retries ANY exception under one, and turns an
interrupt into a retry); each asset body is wrapped in ``assets.ingest.retry_transient_io``,
which asks for a retry only for a transient I/O error (``is_transient``).

* Ctrl-C (SIGINT) during the product's mask step stops the run after one attempt: no
  ``STEP_UP_FOR_RETRY`` in the event log (it was retried, "attempt # 3", three SIGINTs).
* an allocation error (numpy's ``_ArrayMemoryError``) fails the step after one attempt.
* a transient ``OSError`` (a connection reset) is retried, and the retry succeeds.
* the classification itself, on errors raised for real (a missing file, a directory, pyarrow's
  S3 client against a closed port, numpy's allocation error).
"""

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import dagster as dg
import numpy as np
import pytest

from assets.ingest import TRANSIENT_DELAY_S, TRANSIENT_MAX_RETRIES, is_transient, retry_transient_io
from datamask_pipeline.engine import storage
from datamask_pipeline.engine.data import DataContractError

REPO = Path(__file__).resolve().parents[2]
RETRY = dg.DagsterEventType.STEP_UP_FOR_RETRY


def _events(result, kind: str) -> list:
    return [e for e in result.all_events if e.event_type_value == kind]


def _caught(fn) -> BaseException:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the error under test, whatever it is
        return exc
    raise AssertionError("no error raised")


# ------------------------------------------------------------------ interrupts (product mask)
SCRIPT = textwrap.dedent("""
    import sys
    import dagster as dg
    from tests.pipeline.helpers import ALL_ASSETS, DIM, TINY
    from assets.learn import MaskConfig
    from assets.partitions import register_shards
    from datamask_pipeline.engine.sample import generate_corpus
    from dagster_duckdb import DuckDBResource
    from resources.contract import DataContract
    from resources.learner import MaskLearner
    from resources.storage import DataRoot

    root = DataRoot(root=sys.argv[1])
    generate_corpus(root.raw_root, n_shards=1, rows_per_shard=400, dim=DIM, seed=3)
    res = {"data_root": root,
           "contract": DataContract(expected_dim=DIM, quality_min=0.0, quality_max=1.0),
           "learner": MaskLearner(device="cpu", cpu_threads=1, log_interval_s=0.5,
                                  shard_report=False),
           "duckdb": DuckDBResource(database=":memory:"),
           "catalog": DuckDBResource(database=root.catalog())}
    inst = dg.DagsterInstance.get()
    register_shards(inst, root.raw_root)
    dg.materialize(ALL_ASSETS, partition_key="shard_000", instance=inst, resources=res,
                   selection=["features"])
    # learning that would run for hours: only an interrupt ends it
    dg.materialize(ALL_ASSETS, partition_key="shard_000", instance=inst, resources=res,
                   selection=["mask"], raise_on_error=False,
                   run_config=dg.RunConfig({"mask": MaskConfig(**{**TINY, "solver": "paper",
                                                                  "n_epochs": 10**7})}))
    print("MATERIALIZE RETURNED", flush=True)
""")


def _mask_steps(instance) -> tuple:
    """(STEP_START, STEP_UP_FOR_RETRY) events of the mask step, every run of the instance."""
    starts, retries = [], []
    for run in instance.get_runs():
        for e in instance.all_logs(run.run_id):
            ev = e.dagster_event
            if ev is not None and ev.step_key == "mask":
                if ev.event_type == dg.DagsterEventType.STEP_START:
                    starts.append(e)
                elif ev.event_type == RETRY:
                    retries.append(e)
    return starts, retries


def test_sigint_stops_the_mask_step_after_one_attempt(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    log_path = tmp_path / "run.log"
    env = {**os.environ, "DAGSTER_HOME": str(home), "PYTHONPATH": str(REPO)}
    with open(log_path, "w") as log:
        p = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tmp_path / "data")], cwd=REPO,
                             env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        with dg.DagsterInstance.from_config(str(home)) as inst:
            deadline = time.monotonic() + 120
            while not _mask_steps(inst)[0]:
                assert p.poll() is None, log_path.read_text()[-3000:]
                assert time.monotonic() < deadline, log_path.read_text()[-3000:]
                time.sleep(0.2)
            time.sleep(1.5)  # inside the step (torch loaded or loading, learning)
            assert p.poll() is None, log_path.read_text()[-3000:]
            p.send_signal(signal.SIGINT)  # one Ctrl-C
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pytest.fail("one SIGINT did not stop the run:\n" + log_path.read_text()[-3000:])
            starts, retries = _mask_steps(inst)
            runs = inst.get_runs(limit=1)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    text = log_path.read_text()
    assert retries == [], text[-3000:]  # an interrupt is never retried
    assert len(starts) == 1, text[-3000:]
    assert runs[0].status in (dg.DagsterRunStatus.FAILURE, dg.DagsterRunStatus.CANCELED)


# ------------------------------------------------------------------ one attempt, or a retry
def _asset(body, **retry):
    @dg.asset(name="probe")
    @retry_transient_io(**{"seconds_to_wait": 0, **retry})
    def probe(context: dg.AssetExecutionContext):
        return body(context)

    return probe


def _materialize(instance, body, **retry):
    return dg.materialize([_asset(body, **retry)], instance=instance, raise_on_error=False)


def test_an_allocation_error_fails_after_one_attempt(instance):
    def allocate(context):
        return dg.MaterializeResult(metadata={"bytes": int(np.empty(1 << 60, np.uint8).nbytes)})

    r = _materialize(instance, allocate)
    assert not r.success
    assert _events(r, "STEP_START") and len(_events(r, "STEP_START")) == 1
    assert _events(r, "STEP_UP_FOR_RETRY") == []
    err = _events(r, "STEP_FAILURE")[0].step_failure_data.error
    assert "_ArrayMemoryError" in err.to_string() and "Unable to allocate" in err.to_string()


def test_a_missing_file_fails_after_one_attempt(instance, tmp_path):
    def read(context):
        storage.read_bytes(str(tmp_path / "nowhere.parquet"))

    r = _materialize(instance, read)
    assert not r.success and _events(r, "STEP_UP_FOR_RETRY") == []


def test_a_transient_oserror_is_retried_and_the_retry_succeeds(instance):
    def flaky(context):
        if context.retry_number == 0:
            # what a dropped connection to the object store raises, wrapped as storage does
            try:
                raise ConnectionResetError(104, "Connection reset by peer")
            except ConnectionResetError as exc:
                raise storage.StorageError(f"s3://bucket/x: cannot read ({exc})") from exc
        return dg.MaterializeResult(metadata={"attempt": context.retry_number})

    r = _materialize(instance, flaky)
    assert r.success
    retries = _events(r, "STEP_UP_FOR_RETRY")
    assert len(retries) == 1 and "Connection reset" in retries[0].event_specific_data.error.to_string()
    assert r.asset_materializations_for_node("probe")[0].metadata["attempt"].value == 1


def test_a_transient_error_that_persists_fails_after_the_retries(instance):
    def down(context):
        raise TimeoutError("timed out")

    r = _materialize(instance, down)
    assert not r.success
    assert len(_events(r, "STEP_UP_FOR_RETRY")) == TRANSIENT_MAX_RETRIES
    assert "Exceeded max_retries of 2" in _events(r, "STEP_FAILURE")[0].step_failure_data.error.message


def test_every_asset_retries_transient_io_only():
    from datamask_pipeline.definitions import defs

    keys = [k for k in defs.resolve_asset_graph().get_all_asset_keys()
            if defs.get_assets_def(k).is_executable and not defs.get_assets_def(k).is_observable]
    assert len(keys) == 8
    for key in keys:
        a = defs.get_assets_def(key)
        assert a.op.retry_policy is None, key  # a RetryPolicy retries interrupts and OOM
        fn = a.op.compute_fn.decorated_fn
        assert fn.transient_retry == (TRANSIENT_MAX_RETRIES, TRANSIENT_DELAY_S), key


# ------------------------------------------------------------------ the classification
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_is_transient_on_real_errors(tmp_path, monkeypatch):
    (tmp_path / "d").mkdir()
    missing = _caught(lambda: open(tmp_path / "nowhere"))
    a_dir = _caught(lambda: open(tmp_path / "d"))
    refused = _caught(lambda: socket.create_connection(("127.0.0.1", _closed_port()), timeout=2))
    oom = _caught(lambda: np.empty(1 << 60, np.uint8))
    assert isinstance(refused, ConnectionRefusedError)

    assert not is_transient(missing) and not is_transient(a_dir)
    assert not is_transient(_caught(lambda: storage.read_bytes(str(tmp_path / "nowhere"))))
    assert not is_transient(oom) and not is_transient(MemoryError())
    assert not is_transient(DataContractError("f", "rule"))
    assert not is_transient(dg.Failure("bad input", allow_retries=False))
    assert not is_transient(KeyboardInterrupt()) and not is_transient(
        dg.DagsterExecutionInterruptedError())
    assert not is_transient(PermissionError(13, "Permission denied"))
    assert not is_transient(OSError(28, "No space left on device"))
    assert is_transient(refused) and is_transient(TimeoutError())
    assert is_transient(OSError(5, "Input/output error"))

    # a StorageError is judged by what it wraps; one that wraps nothing is not transient
    def wrapped(inner):
        try:
            raise inner
        except OSError as exc:
            try:
                raise storage.StorageError(f"x: failed ({exc})") from exc
            except storage.StorageError as outer:
                return outer

    assert is_transient(wrapped(refused)) and not is_transient(wrapped(missing))
    assert not is_transient(storage.StorageError("x: is a directory"))
    # a transient error raised while handling a missing file is still about the missing file
    try:
        try:
            raise missing
        except FileNotFoundError:
            raise ConnectionResetError(104, "reset")
    except ConnectionResetError as exc:
        assert not is_transient(exc)


def test_pyarrow_s3_network_errors_are_transient(monkeypatch):
    """pyarrow's S3 client against an endpoint that does not answer: a plain OSError naming
    the AWS SDK's NETWORK_CONNECTION error."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{_closed_port()}")
    for var, value in {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "y",
                       "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"}.items():
        monkeypatch.setenv(var, value)
    exc = _caught(lambda: storage.read_bytes("s3://bucket/raw/shard_000.parquet"))
    assert isinstance(exc, OSError) and "NETWORK_CONNECTION" in str(exc), repr(exc)
    assert is_transient(exc)
    assert not is_transient(OSError("AWS Error ACCESS_DENIED during HeadObject operation"))


# ------------------------------------------------------------------ a real outage (product)
def test_features_on_s3_ride_out_an_outage_of_the_endpoint(instance, tmp_path, monkeypatch):
    """The product's ``features`` step on an S3 data root whose endpoint is down at the first
    attempt (connection refused: pyarrow's NETWORK_CONNECTION, reported by the step as an
    unreadable raw shard) and back (moto's S3 server) before the retry: the retry reads the
    shard and the step succeeds. It was not retried before (the step's Failure said "no
    retries", and its RetryPolicy retried every other error instead)."""
    import logging
    import threading

    import moto.server
    import pyarrow.fs as pafs
    import pyarrow.parquet as pq
    from dagster_duckdb import DuckDBResource

    from assets.ingest import features, raw_shard
    from assets.validate import validate_features
    from datamask_pipeline.engine.sample import make_table
    from resources.contract import DataContract
    from resources.storage import DataRoot

    from .helpers import DIM, ROWS

    port = _closed_port()
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": "datamask-test",
           "AWS_SECRET_ACCESS_KEY": "datamask-test-secret", "AWS_REGION": "us-east-1",
           "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
           "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    root = DataRoot(root="s3://datamask-outage/data")
    instance.add_dynamic_partitions("shards", ["shard_000"])
    table = make_table(ROWS, dim=DIM, seed=5)
    server = moto.server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    back = threading.Event()

    def restore_on_retry():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            runs = instance.get_runs(limit=1)
            if runs and instance.all_logs(runs[0].run_id, of_type=RETRY):
                server.start()  # the endpoint is back, with the shard
                fs = pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http",
                                       region="us-east-1", access_key=env["AWS_ACCESS_KEY_ID"],
                                       secret_key=env["AWS_SECRET_ACCESS_KEY"],
                                       allow_bucket_creation=True)
                fs.create_dir("datamask-outage")
                pq.write_table(table, "datamask-outage/data/raw/shard_000.parquet", filesystem=fs)
                back.set()
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=restore_on_retry, daemon=True)
    watcher.start()
    try:
        r = dg.materialize([raw_shard, features, validate_features], partition_key="shard_000",
                           instance=instance, raise_on_error=False,
                           resources={"data_root": root,
                                      "contract": DataContract(expected_dim=DIM),
                                      "duckdb": DuckDBResource(database=":memory:")},
                           selection=dg.AssetSelection.assets(features))
        watcher.join(timeout=30)
    finally:
        if back.is_set():
            server.stop()
    assert back.is_set()
    retries = _events(r, "STEP_UP_FOR_RETRY")
    assert retries and "NETWORK_CONNECTION" in retries[0].event_specific_data.error.to_string()
    assert r.success, [e.step_failure_data.error.to_string() for e in r.all_events
                       if e.is_step_failure]
    mat = r.asset_materializations_for_node("features")[0]
    assert mat.metadata["dagster/row_count"].value == ROWS
