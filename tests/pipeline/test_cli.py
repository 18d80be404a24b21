"""Subprocess tests of the command lines: register, ``dagster asset materialize``, the demo,
and ``dagster dev -w workspace.yaml`` answering GraphQL."""

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import dagster as dg
import pyarrow.parquet as pq
import pytest

from datamask_pipeline import settings
from datamask_pipeline.engine.sample import generate_corpus

REPO = settings.repo_root()
BIN = Path(sys.executable).parent
ROWS, DIM = 300, 16
_FAST_TMP = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@pytest.fixture
def cli_env(tmp_path):
    """Environment of a user who points DATAMASK at a data root and a Dagster home."""
    with tempfile.TemporaryDirectory(dir=_FAST_TMP, prefix="datamask-cli-home-") as home:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DATAMASK_", "DAGSTER_"))}
        env.update(
            DAGSTER_HOME=home,
            DATAMASK_DATA_ROOT=str(tmp_path / "data"),
            DATAMASK_DEVICE="cpu",
            DATAMASK_EMBEDDING_DIM=str(DIM),
            DATAMASK_CPU_THREADS="1",
            PYTHONUNBUFFERED="1",
        )
        yield env


def _run(args, env, timeout=180):
    out = subprocess.run(args, cwd=str(REPO), env=env, capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"{args} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-6000:]}"
    return out


def _register(env) -> str:
    raw = os.path.join(env["DATAMASK_DATA_ROOT"], "raw")
    generate_corpus(raw, n_shards=2, rows_per_shard=ROWS, dim=DIM, seed=1)
    out = _run([sys.executable, "-m", "datamask_pipeline.register"], env)
    assert "added 2 partition(s): shard_000, shard_001" in out.stdout
    return raw


def _instance(env) -> dg.DagsterInstance:
    return dg.DagsterInstance.from_config(env["DAGSTER_HOME"])


def test_register_then_dagster_asset_materialize(cli_env):
    # registering: a missing raw location is an error, bad file names are reported and skipped
    missing = subprocess.run([sys.executable, "-m", "datamask_pipeline.register"], cwd=str(REPO),
                             env=cli_env, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "directory does not exist" in missing.stderr
    raw = _register(cli_env)
    Path(raw, "shard 9.parquet").write_bytes(Path(raw, "shard_000.parquet").read_bytes())
    again = subprocess.run([sys.executable, "-m", "datamask_pipeline.register"], cwd=str(REPO),
                           env=cli_env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 1
    assert "added 0 partition(s)" in again.stdout and "already registered: 2" in again.stdout
    assert "shard 9.parquet" in again.stderr and "only letters, digits" in again.stderr
    with _instance(cli_env) as inst:
        assert sorted(inst.get_dynamic_partitions("shards")) == ["shard_000", "shard_001"]
    data = Path(cli_env["DATAMASK_DATA_ROOT"])

    # the chain of one partition, with its blocking checks, from the CLI
    _run([str(BIN / "dagster"), "asset", "materialize", "-m", "datamask_pipeline.definitions",
          "--select", "features,mask,selected_subset", "--partition", "shard_000"], cli_env)
    selected = pq.read_table(data / "selected_per_shard" / "shard_000.parquet")
    raw_table = pq.read_table(data / "raw" / "shard_000.parquet")
    assert selected.num_rows == round(0.1 * ROWS) and selected.schema == raw_table.schema
    assert not (data / "selected_per_shard" / "shard_001.parquet").exists()

    # the mask step alone, with a config from the command line
    _run([str(BIN / "dagster"), "asset", "materialize", "-m", "datamask_pipeline.definitions",
          "--select", "mask", "--partition", "shard_000",
          "--config-json", json.dumps({"ops": {"mask": {"config": {"seed": 7}}}})], cli_env)
    with _instance(cli_env) as inst:
        recs = inst.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey("mask"), asset_partitions=["shard_000"]),
            limit=2).records
        hashes = [r.asset_materialization.metadata["config_hash"].value for r in recs]
        used = recs[0].asset_materialization.metadata["config"].value
        checks = inst.event_log_storage.get_asset_check_execution_history(
            dg.AssetCheckKey(dg.AssetKey("features"), "unique_ids"), limit=5)
    assert used == {**settings.learner_defaults("pipeline"), "seed": 7}
    assert len(hashes) == 2 and hashes[0] != hashes[1]  # newest (seed 7) first
    assert len(checks) == 1  # the blocking checks ran with the chain, not with mask alone


def test_demo_command(cli_env):
    # a data root named in the environment holds no shards: sample data only when asked
    out = _run([sys.executable, "-m", "datamask_pipeline.demo", "--generate-sample", "--shards",
                "2", "--rows", str(ROWS), "--dim", str(DIM), "--per-shard-chain",
                "--select-ratio", "0.2"], cli_env, timeout=300)
    data = Path(cli_env["DATAMASK_DATA_ROOT"])
    assert out.stdout.startswith(f"SAMPLE DATA: --generate-sample: generated 2 shard(s) x {ROWS} "
                                 f"rows of sample text with {DIM}-d embeddings in {data / 'raw'}")
    for key in ("shard_000", "shard_001"):
        path = data / "selected_per_shard" / f"{key}.parquet"
        assert str(path) in out.stdout
        # --select-ratio reaches each shard's mask (it was ignored by the chain before)
        assert pq.read_metadata(path).num_rows == round(0.2 * ROWS)
        assert os.path.isfile(data / "reports" / key / "report.html")
    assert "f selection" in out.stdout and "route" in out.stdout and "total" in out.stdout
    assert (data / "catalog.duckdb").is_file()
    with _instance(cli_env) as inst:  # the runs are in the instance the UI opens
        runs = inst.get_runs(dg.RunsFilter(job_name="datamask_job"))
        assert sorted(r.tags["dagster/partition"] for r in runs) == ["shard_000", "shard_001"]
        assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _graphql(port: int, query: str) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/graphql",
                                 data=json.dumps({"query": query}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return json.loads(resp.read())


ASSETS_QUERY = """
{ assetNodes { assetKey { path } groupName isPartitioned partitionKeys
               partitionDefinition { name } } }
"""


def _mask_step_windows(inst, run_id) -> list:
    times = {}
    for e in inst.all_logs(run_id):
        if e.dagster_event and e.step_key == "mask" and e.dagster_event.event_type_value in (
                "STEP_START", "STEP_SUCCESS"):
            times[e.dagster_event.event_type_value] = e.timestamp
    return [times["STEP_START"], times["STEP_SUCCESS"]]


def test_dagster_dev_graphql_and_cli_backfill(cli_env, tmp_path):
    """``dagster dev`` serves the assets and partitions over GraphQL, and its daemon executes a
    multi-partition backfill launched from the CLI (one run per shard, the mask steps of the
    runs one at a time through the "gpu" pool of the instance's dagster.yaml)."""
    _register(cli_env)
    port = _free_port()
    log = open(tmp_path / "dagster_dev.log", "w")
    proc = subprocess.Popen(
        [str(BIN / "dagster"), "dev", "-w", "workspace.yaml", "-h", "127.0.0.1", "-p", str(port)],
        cwd=str(REPO), env=cli_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        nodes = None
        while time.monotonic() < deadline:
            assert proc.poll() is None, (tmp_path / "dagster_dev.log").read_text()[-4000:]
            try:
                nodes = _graphql(port, ASSETS_QUERY)["data"]["assetNodes"]
                if nodes:
                    break
            except (urllib.error.URLError, ConnectionError, KeyError, TypeError, OSError):
                pass
            time.sleep(0.5)
        assert nodes, (tmp_path / "dagster_dev.log").read_text()[-4000:]
        by_key = {"/".join(n["assetKey"]["path"]): n for n in nodes}
        assert set(by_key) == {"raw_shard", "features", "mask", "shard_report", "selected_subset",
                               "corpus_summary", "corpus_selection", "corpus_subset", "corpus_dedup"}
        for key in ("raw_shard", "features", "mask", "selected_subset"):
            assert by_key[key]["isPartitioned"] and by_key[key]["groupName"] == "datamask"
            assert by_key[key]["partitionKeys"] == ["shard_000", "shard_001"]
        for key in ("corpus_summary", "corpus_selection", "corpus_subset", "corpus_dedup"):
            assert not by_key[key]["isPartitioned"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=10) as resp:
            assert resp.status == 200

        # a backfill over both partitions, queued from the CLI, run by the daemon
        out = _run([str(BIN / "dagster"), "job", "backfill", "-w", "workspace.yaml", "-j",
                    "datamask_job", "--partitions", "shard_000,shard_001", "--noprompt"], cli_env)
        assert "Launched backfill" in out.stdout
        data = Path(cli_env["DATAMASK_DATA_ROOT"])
        with _instance(cli_env) as inst:
            runs = []
            while time.monotonic() < deadline + 120:
                runs = inst.get_runs(dg.RunsFilter(job_name="datamask_job"))
                if len(runs) == 2 and all(r.is_finished for r in runs):
                    break
                assert proc.poll() is None
                time.sleep(0.5)
            assert sorted(r.tags["dagster/partition"] for r in runs) == ["shard_000", "shard_001"]
            assert all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs), \
                (tmp_path / "dagster_dev.log").read_text()[-4000:]
            assert len({r.tags["dagster/backfill"] for r in runs}) == 1
            (a0, a1), (b0, b1) = sorted(_mask_step_windows(inst, r.run_id) for r in runs)
            assert a1 <= b0  # one mask step at a time
        for key in ("shard_000", "shard_001"):
            assert pq.read_metadata(data / "selected_per_shard" / f"{key}.parquet").num_rows == round(0.1 * ROWS)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()


def test_dg_check_list_and_launch(cli_env):
    """The `dg` command line on this layout (datamask_pipeline/, assets/, resources/): the
    definitions check and list, and `dg launch` materializes one shard's features."""
    _run([str(BIN / "dg"), "check", "defs"], cli_env)
    listed = json.loads(_run([str(BIN / "dg"), "list", "defs", "--json"], cli_env).stdout)
    assert {a["asset_key"] for a in listed["assets"]} == {
        "raw_shard", "features", "mask", "shard_report", "selected_subset", "corpus_summary",
        "corpus_selection", "corpus_subset", "corpus_dedup"}
    _register(cli_env)
    _run([str(BIN / "dg"), "launch", "--assets", "features", "--partition", "shard_001"], cli_env)
    data = Path(cli_env["DATAMASK_DATA_ROOT"])
    assert (data / "features" / "shard_001.parquet").is_file()
    assert not (data / "features" / "shard_000.parquet").exists()
