"""Shared pieces of the reliability tests (issue 5): sizes, environments of subprocesses,
file listings, killing process groups, run-overlap bookkeeping.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg

from datamask_pipeline import settings
from datamask_pipeline.engine.sample import make_table

REPO = settings.repo_root()
BIN = Path(sys.executable).parent
# The Dagster instances (sqlite, one commit per event) and the checkpointing data roots live on
# a tmpfs when there is one: fsync there is free, on a disk it is ~0.1 s per checkpoint.
FAST_TMP = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None

ROWS, DIM = 300, 16
# k = 30 of 300, batches of 60 rows, masks of k' = 6; 30 steps.
TINY = dict(n_epochs=30, n_rollout=16, partial=0.2, select_ratio=0.1)
CLI_TINY = ["--n_epochs", "30", "--n_rollout", "16", "--partial", "0.2", "--select_ratio", "0.1",
            "--seed", "0", "--no-progress"]
K = round(TINY["select_ratio"] * ROWS)

# Put into the environment of every run; must never show up in logs, events or metadata.
SECRET_SENTINEL = "sentinel-AWS-secret-5e1f0c9a7d"


def good_table(n: int = ROWS, seed: int = 5, id_offset: int = 0):
    """A valid shard: chunk_id, quality_score, feature_arr (16-d), text, source."""
    return make_table(n, dim=DIM, seed=seed, id_offset=id_offset)


def clean_env(**extra) -> dict:
    """The test process's environment without DATAMASK_*/DAGSTER_* settings, with the
    repository importable (``tests.reliability...`` helpers run as scripts) and the secret
    sentinel set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATAMASK_", "DAGSTER_"))}
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    # one torch/OpenMP thread per process: on a loaded 2-core machine two spinning OpenMP
    # threads per process made a 0.3 s learning run take 17 s
    env["OMP_NUM_THREADS"] = "1"
    env["AWS_SECRET_ACCESS_KEY"] = SECRET_SENTINEL
    env.update({k: str(v) for k, v in extra.items()})
    return env


def dagster_env(home, data_root, **extra) -> dict:
    """Environment of a user who points DATAMASK at a data root and a Dagster home (CPU, one
    torch thread, 16-d embeddings declared)."""
    return clean_env(DAGSTER_HOME=str(home), DATAMASK_DATA_ROOT=str(data_root),
                     DATAMASK_DEVICE="cpu", DATAMASK_CPU_THREADS="1",
                     DATAMASK_EMBEDDING_DIM=str(DIM), **extra)


def init_home(home) -> str:
    """A Dagster home with the repository's dagster.yaml (pools, run retries) in it."""
    os.makedirs(home, exist_ok=True)
    target = os.path.join(home, "dagster.yaml")
    if not os.path.exists(target):
        with open(REPO / "dagster.yaml", "rb") as src, open(target, "wb") as dst:
            dst.write(src.read())
    return str(home)


def visible_files(d) -> list:
    """Names directly in ``d`` that a listing of outputs shows (hidden names are in-flight
    temp files of atomic writes)."""
    if not os.path.isdir(d):
        return []
    return sorted(n for n in os.listdir(d) if not n.startswith("."))


def all_files(root) -> list:
    out = []
    for d, _, files in os.walk(root):
        for f in files:
            out.append(os.path.relpath(os.path.join(d, f), root))
    return sorted(out)


def sha(path) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def read_bytes(path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def kill_group(proc: subprocess.Popen) -> int:
    """SIGKILL the process group of ``proc`` (started with ``start_new_session=True``) and
    reap it; returns its exit code (-9 when the kill landed, 0 when it had finished)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return proc.wait(timeout=60)


def _mtime(path):
    try:
        return os.stat(path).st_mtime_ns
    except FileNotFoundError:
        return None


def wait_for_file(path, proc: subprocess.Popen, timeout: float, poll: float = 0.002) -> bool:
    """Poll until ``path`` is (re)written by ``proc``: it exists and, if it existed when the
    wait began, its mtime changed. False when ``proc`` ended or the time ran out first."""
    before = _mtime(path)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = _mtime(path)
        if now is not None and now != before:
            return True
        if proc.poll() is not None:
            return False
        time.sleep(poll)
    return False


def max_overlap(intervals) -> int:
    """The largest number of (start, end) intervals that hold at one instant."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals],
                    key=lambda x: (x[0], x[1]))
    cur = best = 0
    for _, d in events:
        cur += d
        best = max(best, cur)
    return best


def run_windows(instance: dg.DagsterInstance, run_ids) -> list:
    """(RUN_START, RUN_SUCCESS/RUN_FAILURE) timestamps of each run, from its event log."""
    out = []
    for rid in run_ids:
        start = end = None
        for e in instance.all_logs(rid):
            t = e.dagster_event_type
            if t == dg.DagsterEventType.RUN_START:
                start = e.timestamp
            elif t in (dg.DagsterEventType.RUN_SUCCESS, dg.DagsterEventType.RUN_FAILURE):
                end = e.timestamp
        assert start is not None and end is not None, rid
        out.append((start, end))
    return out


def error_text(result) -> str:
    """Every failure description of a dg.materialize result: failed checks and failed steps."""
    msgs = [e.description or "" for e in result.get_asset_check_evaluations() if not e.passed]
    for e in result.all_events:
        if e.is_step_failure and e.step_failure_data is not None and e.step_failure_data.error:
            msgs.append(e.step_failure_data.error.to_string())  # with causes
    return "\n".join(msgs)


def retried_steps(result) -> list:
    return [e.step_key for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]


def run_cli_batch(spec: dict, workdir, timeout: float = 300) -> dict:
    """Run ``{name: argv}`` through ``train_mask`` in one subprocess (tests/reliability/
    cli_batch.py: ``cli.main(argv)`` per case); returns ``{name: {rc, stderr, stdout}}``."""
    spec_path = os.path.join(workdir, "cli_batch_spec.json")
    out_path = os.path.join(workdir, "cli_batch_results.json")
    with open(spec_path, "w") as fh:
        json.dump(spec, fh)
    r = subprocess.run([sys.executable, "-m", "tests.reliability.cli_batch", spec_path, out_path],
                       cwd=str(REPO), env=clean_env(), capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, f"cli_batch failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    with open(out_path) as fh:
        return json.load(fh)


def start_cli(argv, **popen) -> subprocess.Popen:
    """``python -m datamask_pipeline.engine.cli ARGV`` as its own process group."""
    return subprocess.Popen([sys.executable, "-m", "datamask_pipeline.engine.cli", *argv],
                            cwd=str(REPO), env=clean_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, **popen)
