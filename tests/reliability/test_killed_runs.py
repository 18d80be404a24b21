"""Issue 5, item 2: killed runs resume and end with exactly the uninterrupted selection.

* Engine CLI: ``train_mask --checkpoint`` is SIGKILLed at random points (seeded: some trials
  at a random time after launch, some at a random time after the first checkpoint appeared),
  its output directory is inspected right after the kill (no visible half-written file:
  every visible output is complete, the checkpoint loads), and a rerun of the same command
  resumes from the checkpoint and writes byte-identical outputs.
* Dagster: ``dagster asset materialize --select mask`` (the product's definitions, the mask's
  checkpoint every few steps through run config) is SIGKILLed mid-learning; a new run
  resumes from the checkpoint (``resumed_from_step`` in the metadata) and writes the mask
  parquet byte-identical to an uninterrupted run's.
* Retries: only a transient I/O error is retried in the run (``retry_transient_io``; issue 26:
  no ``RetryPolicy``, which retried interrupts and allocation errors too). A mask step that
  fails after learning (its publish path blocked) fails after one attempt, and the next run
  resumes from the checkpoint (no step recomputed). Slow variant: the multiprocess
  executor's mask step process is SIGKILLed (what the OOM killer does): the step fails once,
  not retried, and the next run resumes.
"""

import json
import os
import random
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import dagster as dg
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from dagster_duckdb import DuckDBResource

from assets.learn import MaskConfig
from assets.partitions import register_shards
from datamask_pipeline.jobs import datamask_job
from datamask_pipeline.recover import recover
from resources.contract import DataContract
from resources.learner import MaskLearner
from resources.storage import DataRoot
from tests.pipeline.helpers import ALL_ASSETS

from .helpers import (
    BIN,
    DIM,
    REPO,
    SECRET_SENTINEL,
    dagster_env,
    good_table,
    init_home,
    kill_group,
    read_bytes,
    start_cli,
    visible_files,
    wait_for_file,
)

KILL_ROWS = 2000
# ~1-2 s of learning at one thread: long enough to land kills inside it
KILL_ARGS = ["--device", "cpu", "--n_epochs", "1500", "--n_rollout", "64", "--partial", "0.1",
             "--select_ratio", "0.1", "--seed", "4", "--no-progress"]
# solver paper: the learner is what writes and resumes checkpoints
MASK_KILL = dict(n_epochs=1500, n_rollout=64, partial=0.1, select_ratio=0.1, seed=4, solver="paper")
OUTPUTS = {"out.parquet", "masks.parquet", "ck.pt"}


def _load_step(path) -> int:
    return int(torch.load(path, map_location="cpu", weights_only=True)["step"])


def _cli_argv(inp, d, checkpoint=True):
    argv = ["--input", str(inp), "--output", os.path.join(d, "out.parquet"),
            "--masks-output", os.path.join(d, "masks.parquet"), *KILL_ARGS]
    if checkpoint:
        argv += ["--checkpoint", os.path.join(d, "ck.pt"), "--checkpoint-every", "10"]
    return argv


def _run_cli(argv, timeout=300) -> dict:
    p = start_cli(argv)
    out, err = p.communicate(timeout=timeout)
    assert p.returncode == 0, err[-3000:]
    return json.loads(out)


@pytest.fixture
def kill_input(fast_dir):
    path = os.path.join(fast_dir, "in.parquet")
    pq.write_table(good_table(KILL_ROWS, seed=8), path)
    ref = os.path.join(fast_dir, "reference")
    os.makedirs(ref)
    t0 = time.monotonic()
    summary = _run_cli(_cli_argv(path, ref, checkpoint=False))
    wall = time.monotonic() - t0
    return {"input": path, "base": fast_dir, "wall": wall, "learn": summary["timings_s"]["learn_s"],
            "out": read_bytes(os.path.join(ref, "out.parquet")),
            "masks": read_bytes(os.path.join(ref, "masks.parquet"))}


def kill_trial(seed: int, ki: dict) -> dict:
    """One SIGKILL at a seeded random point, the state check, the rerun."""
    rng = random.Random(seed)
    d = os.path.join(ki["base"], f"trial_{seed}")
    os.makedirs(d)
    ck = os.path.join(d, "ck.pt")
    argv = _cli_argv(ki["input"], d)
    p = start_cli(argv)
    if seed % 2 == 0:  # a random point of the learning
        assert wait_for_file(ck, p, timeout=120), p.communicate()[1][-2000:]
        time.sleep(rng.uniform(0.0, ki["learn"]))
    else:  # a random point of the whole process life (start-up, reading, learning, writing)
        time.sleep(rng.uniform(0.0, ki["wall"]))
    rc = kill_group(p)
    p.stdout.close()
    p.stderr.close()
    info = {"seed": seed, "killed": rc == -9, "rc": rc}
    # ---- right after the kill: nothing half-written is visible
    vis = set(visible_files(d))
    assert vis <= OUTPUTS, vis
    for name in ("out.parquet", "masks.parquet"):
        if name in vis:  # published => complete and final
            assert read_bytes(os.path.join(d, name)) == ki[name.split(".")[0]], name
    info["temps_left"] = sorted(n for n in os.listdir(d) if n.startswith("."))
    assert all(".tmp-" in n for n in info["temps_left"]), info
    info["checkpoint_step"] = _load_step(ck) if "ck.pt" in vis else None
    # ---- rerun the same command
    summary = _run_cli(argv)
    if info["checkpoint_step"] is not None:
        assert info["checkpoint_step"] > 0
        assert summary["resumed_from"] == info["checkpoint_step"], (summary["resumed_from"], info)
    else:
        assert summary["resumed_from"] is None
    info["resumed_from"] = summary["resumed_from"]
    assert read_bytes(os.path.join(d, "out.parquet")) == ki["out"]
    assert read_bytes(os.path.join(d, "masks.parquet")) == ki["masks"]
    assert set(visible_files(d)) == OUTPUTS
    return info


def _kill_trials(ki, seeds, workers=2) -> list:
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda s: kill_trial(s, ki), seeds))


def _report(infos):
    killed = [i for i in infos if i["killed"]]
    resumed = [i for i in killed if i["resumed_from"]]
    print(f"\nCLI kill trials: {len(infos)} run, {len(killed)} SIGKILLed, {len(resumed)} resumed "
          f"from a checkpoint (steps {sorted(i['resumed_from'] for i in resumed)}), temp files "
          f"left by kills: {sum(len(i['temps_left']) for i in infos)}")
    return killed, resumed


def test_cli_sigkill_at_random_points_then_rerun_matches(kill_input):
    infos = _kill_trials(kill_input, seeds=range(3), workers=3)
    killed, resumed = _report(infos)
    assert len(killed) >= 2, infos
    assert len(resumed) >= 2, infos  # the learning-phase kills resumed mid-way


@pytest.mark.slow
def test_cli_sigkill_many_trials(kill_input):
    infos = _kill_trials(kill_input, seeds=range(100, 116))
    killed, resumed = _report(infos)
    assert len(killed) >= 12 and len(resumed) >= 8, infos


# ------------------------------------------------------------------ Dagster
def _mask_config_json(checkpoint_every=10, **extra):
    return json.dumps({"ops": {"mask": {"config": {**MASK_KILL, **extra}}},
                       "resources": {"learner": {"config": {"checkpoint_every": checkpoint_every,
                                                            "shard_report": False}}}})


def _resources(root, checkpoint_every=10):
    return {"data_root": DataRoot(root=str(root)), "contract": DataContract(expected_dim=DIM),
            "learner": MaskLearner(device="cpu", cpu_threads=1, shard_report=False,
                                   checkpoint_every=checkpoint_every, log_interval_s=0.5),
            "duckdb": DuckDBResource(database=":memory:"),
            "catalog": DuckDBResource(database=DataRoot(root=str(root)).catalog())}


def _mask_meta(instance, key):
    recs = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey("mask"), asset_partitions=[key]), limit=1).records
    return recs[0].asset_materialization


KEY = "shard_k"


def _new_world(base, name):
    root = os.path.join(base, name, "data")
    os.makedirs(os.path.join(root, "raw"))
    pq.write_table(good_table(KILL_ROWS, seed=8), os.path.join(root, "raw", f"{KEY}.parquet"))
    return {"root": root, "home": init_home(os.path.join(base, name, "home"))}


@pytest.fixture(scope="module")
def reference_mask(tmp_path_factory):
    """An uninterrupted in-process run of the mask on the shard: its parquet bytes and data
    version."""
    ref = _new_world(str(tmp_path_factory.mktemp("kill_reference")), "reference")
    with dg.DagsterInstance.from_config(ref["home"]) as inst:
        register_shards(inst, os.path.join(ref["root"], "raw"))
        res = dg.materialize(ALL_ASSETS, partition_key=KEY, instance=inst, resources=_resources(ref["root"]),
                             run_config=dg.RunConfig({"mask": MaskConfig(**MASK_KILL)}),
                             selection=dg.AssetSelection.assets("features", "mask"))
        assert res.success
        ref["mask"] = read_bytes(DataRoot(root=ref["root"]).mask(KEY))
        ref["version"] = _mask_meta(inst, KEY).tags["dagster/data_version"]
    return ref


@pytest.fixture
def shard_world(fast_dir, reference_mask):
    """A data root on tmpfs with the raw shard and its materialized features (with their
    checks), a Dagster home with the repository's dagster.yaml ("gpu" pool of 1)."""
    w = _new_world(fast_dir, "killed")
    with dg.DagsterInstance.from_config(w["home"]) as inst:
        register_shards(inst, os.path.join(w["root"], "raw"))
        assert dg.materialize(ALL_ASSETS, partition_key=KEY, instance=inst,
                              resources=_resources(w["root"]),
                              selection=dg.AssetSelection.assets("features")).success
    return {"key": KEY, "killed": w, "reference": reference_mask, "base": fast_dir}


def _sigkill_dagster_mask(sw, seed, module="datamask_pipeline.definitions", extra_env=None):
    """Start `dagster asset materialize --select mask`, SIGKILL its process group at a random
    point after the first checkpoint; returns (checkpoint step, run id, log text)."""
    w, key = sw["killed"], sw["key"]
    root = DataRoot(root=w["root"])
    ck = root.checkpoint(key)
    log_path = os.path.join(sw["base"], f"materialize_{seed}.log")
    with open(log_path, "w") as log:
        p = subprocess.Popen(
            [str(BIN / "dagster"), "asset", "materialize", "-m", module, "--select", "mask",
             "--partition", key, "--config-json", _mask_config_json()],
            cwd=str(REPO), env=dagster_env(w["home"], w["root"], **(extra_env or {})),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        assert wait_for_file(ck, p, timeout=240), open(log_path).read()[-3000:]
        time.sleep(random.Random(seed).uniform(0.0, 0.4))
        rc = kill_group(p)
    text = open(log_path).read()
    assert rc == -9, f"the run finished before the kill (rc {rc}):\n{text[-2000:]}"
    assert SECRET_SENTINEL not in text  # the secret in its environment is never logged
    assert not os.path.exists(root.mask(key))  # nothing published by the killed run
    assert visible_files(os.path.dirname(ck)) == [os.path.basename(ck)]
    return _load_step(ck), text


def test_dagster_run_sigkilled_mid_learning_resumes(shard_world):
    sw, key = shard_world, shard_world["key"]
    w = sw["killed"]
    root = DataRoot(root=w["root"])
    step, text = _sigkill_dagster_mask(sw, seed=1)
    assert 0 < step < MASK_KILL["n_epochs"], step
    with dg.DagsterInstance.from_config(w["home"]) as inst:
        killed = inst.get_runs(limit=1)[0]
        # a SIGKILLed run worker cannot report anything: its run stays STARTED and keeps the
        # "gpu" pool slot it claimed (limit 1), which blocked every later mask step forever
        assert killed.status == dg.DagsterRunStatus.STARTED
        claimed = inst.event_log_storage.get_concurrency_info("gpu").claimed_slots
        assert [c.run_id for c in claimed] == [killed.run_id]
        # the recovery of killed local runs (python -m datamask_pipeline.recover) marks it
        # failed and frees the slot; the command line itself runs in the slow variant
        done = recover(inst)
        assert [(r, reason.startswith("run worker process")) for r, _pid, reason in done] == [
            (killed.run_id, True)]
        assert inst.get_run_by_id(killed.run_id).status == dg.DagsterRunStatus.FAILURE
        assert inst.event_log_storage.get_concurrency_info("gpu").claimed_slots == []
        # a new run of the mask (what a run retry or a re-execution launches) resumes
        res = dg.materialize(ALL_ASSETS, partition_key=key, instance=inst,
                             resources=_resources(w["root"]),
                             run_config=dg.RunConfig({"mask": MaskConfig(**MASK_KILL)}),
                             selection=[dg.AssetKey("mask")])
        assert res.success
        mat = _mask_meta(inst, key)
    assert mat.metadata["resumed_from_step"].value == step
    assert mat.metadata["steps"].value == MASK_KILL["n_epochs"]
    assert read_bytes(root.mask(key)) == sw["reference"]["mask"]
    assert mat.tags["dagster/data_version"] == sw["reference"]["version"]
    assert not os.path.exists(root.checkpoint(key))  # removed once the mask was published
    for d in ("masks", "checkpoints"):
        assert visible_files(os.path.join(w["root"], d)) == (["shard_k.parquet"] if d == "masks" else [])


def test_a_failed_publish_is_not_retried_and_the_next_run_resumes(shard_world):
    """A failure after learning (the mask file cannot be published: its path is blocked by a
    directory) fails the step after one attempt: the same path would fail again, so it is not
    retried. Once the path is cleared, the next run resumes from the checkpoint: no step is
    recomputed."""
    sw, key = shard_world, shard_world["key"]
    w = sw["killed"]
    root = DataRoot(root=w["root"])
    blocker = root.mask(key)
    os.makedirs(os.path.join(blocker, "in_the_way"))

    with dg.DagsterInstance.from_config(w["home"]) as inst:
        def run():
            return dg.materialize(ALL_ASSETS, partition_key=key, instance=inst,
                                  resources=_resources(w["root"]),
                                  run_config=dg.RunConfig({"mask": MaskConfig(**MASK_KILL)}),
                                  selection=[dg.AssetKey("mask")], raise_on_error=False)

        failed = run()
        assert not failed.success
        assert not [e for e in failed.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
        err = [e for e in failed.all_events if e.is_step_failure][0].step_failure_data.error
        assert "StorageError" in err.to_string() and "is a directory" in err.to_string()
        os.rmdir(os.path.join(blocker, "in_the_way"))
        os.rmdir(blocker)
        res = run()
        assert res.success
        logs = [e.message for e in inst.all_logs(res.run_id) if e.message]
        mat = _mask_meta(inst, key)
    # the retry found the first attempt's final checkpoint and did not learn again
    assert mat.metadata["resumed_from_step"].value == MASK_KILL["n_epochs"]
    assert any(f"resumed from the checkpoint at step {MASK_KILL['n_epochs']}" in m for m in logs)
    assert read_bytes(root.mask(key)) == sw["reference"]["mask"]


def test_run_retry_configuration():
    """Run-level retries (the daemon) are the instance's: one retry for every run, whatever
    launched it (no job-level tag needed); step-level: transient I/O errors only
    (``retry_transient_io``), no RetryPolicy (it retried interrupts and allocation errors)."""
    from assets.learn import mask

    assert "dagster/max_retries" not in datamask_job.tags  # one owner: the instance
    with open(REPO / "dagster.yaml") as fh:
        conf = yaml.safe_load(fh)
    with dg.instance_for_test(overrides={"run_retries": conf["run_retries"]}) as inst:
        assert inst.run_retries_enabled and inst.run_retries_max_retries == 1
    assert mask.op.retry_policy is None
    assert mask.op.compute_fn.decorated_fn.transient_retry[0] >= 1


# ------------------------------------------------------------------ slow: multiprocess
def _descendants(pid: int) -> list:
    children = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{d}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append((int(d), cmd))
    out, todo = [], [pid]
    while todo:
        for child, cmd in children.get(todo.pop(), []):
            out.append((child, cmd))
            todo.append(child)
    return out


@pytest.mark.slow
def test_multiprocess_step_sigkill_fails_once_and_the_next_run_resumes(shard_world):
    """The mask step runs in its own process (multiprocess executor, tests/reliability/
    mp_defs.py: the product's assets and resources); SIGKILL that process mid-learning (what
    the OOM killer does): the orchestrator sees the crash and fails the step, without a retry
    (no RetryPolicy: a step killed for its memory would be killed again); the next run of the
    same command resumes from the checkpoint."""
    sw, key = shard_world, shard_world["key"]
    w = sw["killed"]
    root = DataRoot(root=w["root"])
    ck = root.checkpoint(key)
    log_path = os.path.join(sw["base"], "mp.log")
    with open(log_path, "w") as log:
        p = subprocess.Popen(
            [str(BIN / "dagster"), "asset", "materialize", "-m", "tests.reliability.mp_defs",
             "--select", "mask", "--partition", key, "--config-json", _mask_config_json()],
            cwd=str(REPO), env=dagster_env(w["home"], w["root"]), stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)
        try:
            assert wait_for_file(ck, p, timeout=300), open(log_path).read()[-3000:]
            steps = [pid for pid, cmd in _descendants(p.pid) if "spawn_main" in cmd]
            assert len(steps) == 1, _descendants(p.pid)
            step_at_kill = _load_step(ck)
            os.kill(steps[0], 9)
            rc = p.wait(timeout=400)
        finally:
            if p.poll() is None:
                kill_group(p)
    text = open(log_path).read()
    assert rc != 0, text[-4000:]
    with dg.DagsterInstance.from_config(w["home"]) as inst:
        run = inst.get_runs(limit=1)[0]
        assert run.status == dg.DagsterRunStatus.FAILURE
        assert not inst.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_UP_FOR_RETRY)
    again = subprocess.run(
        [str(BIN / "dagster"), "asset", "materialize", "-m", "tests.reliability.mp_defs",
         "--select", "mask", "--partition", key, "--config-json", _mask_config_json()],
        cwd=str(REPO), env=dagster_env(w["home"], w["root"]), capture_output=True, text=True,
        timeout=400)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    with dg.DagsterInstance.from_config(w["home"]) as inst:
        mat = _mask_meta(inst, key)
    assert mat.metadata["resumed_from_step"].value >= step_at_kill > 0
    assert read_bytes(root.mask(key)) == sw["reference"]["mask"]


@pytest.mark.slow
def test_dagster_kills_recover_command_and_cli_reruns(shard_world):
    """Three SIGKILLs of ``dagster asset materialize`` at random points of the learning, each
    followed by ``python -m datamask_pipeline.recover`` and a rerun of the same command line:
    every rerun resumes where the kill left the checkpoint, the last one ends with the
    uninterrupted mask."""
    sw, key = shard_world, shard_world["key"]
    w = sw["killed"]
    root = DataRoot(root=w["root"])
    env = dagster_env(w["home"], w["root"])
    for seed in (11, 12, 13):
        step, _ = _sigkill_dagster_mask(sw, seed=seed)
        assert step > 0
        out = subprocess.run([sys.executable, "-m", "datamask_pipeline.recover"], cwd=str(REPO),
                             env=env, capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "marked run" in out.stdout, out.stdout + out.stderr[-2000:]
        assert "1 run(s) with a dead worker" in out.stdout
    # the last checkpoint is resumed by the command line itself
    r = subprocess.run([str(BIN / "dagster"), "asset", "materialize", "-m", "datamask_pipeline.definitions",
                        "--select", "mask", "--partition", key, "--config-json", _mask_config_json()],
                       cwd=str(REPO), env=env, capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    with dg.DagsterInstance.from_config(w["home"]) as inst:
        mat = _mask_meta(inst, key)
        statuses = [x.status for x in inst.get_runs()]
    assert mat.metadata["resumed_from_step"].value == step
    assert read_bytes(root.mask(key)) == sw["reference"]["mask"]
    assert statuses.count(dg.DagsterRunStatus.FAILURE) == 3
