"""The engine's upstream-compatible command line, run as a subprocess."""

import io
import json
import os
import re
import time
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from datamask_pipeline.engine.sample import make_table

UPSTREAM = ["--n_epochs", "40", "--algorithm", "Pair_simi", "--partial", "0.2", "--max_lr", "10",
            "--min_lr", "1", "--n_rollout", "16", "--select_ratio", "0.3", "--init", "quality",
            "--lamb", "0.5"]


def run_cli(*args, env=None):
    return subprocess.run(
        [sys.executable, "-m", "datamask_pipeline.engine.cli", *args],
        capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})},
    )


@pytest.fixture
def shard(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(make_table(500, dim=16, seed=1), path)
    return path


def test_cli_end_to_end_keeps_every_input_column(shard, tmp_path):
    out = tmp_path / "out.parquet"
    masks = tmp_path / "masks.parquet"
    r = run_cli("--input", str(shard), "--output", str(out), "--device", "cpu", *UPSTREAM,
                "--seed", "3", "--masks-output", str(masks))
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    src = pq.read_table(shard)
    got = pq.read_table(out)
    assert got.schema == src.schema
    assert got.num_rows == round(0.3 * 500) == summary["k"] == summary["rows_written"]
    # the selected rows are exactly the input rows with the selected ids, text untouched
    sel = set(pq.read_table(masks).filter(pa.compute.field("selected")).column("chunk_id").to_pylist())
    assert set(got.column("chunk_id").to_pylist()) == sel
    by_id = {r["chunk_id"]: r for r in src.to_pylist()}
    for row in got.to_pylist()[:20]:
        assert row == by_id[row["chunk_id"]]
    obj = summary["objective"]
    assert obj["selection"]["f"] > obj["random"]["f"]
    assert summary["term"] == "Pair_simi" and summary["solver"] == summary["route"] == "paper"
    # the tqdm progress bar on stderr with the documented numbers
    assert "f_mean=" in r.stderr and "eta=" in r.stderr and "40/40" in r.stderr
    # what the run costs, said before the learner starts (issue 20 item 20)
    plan = r.stderr.index("train_mask: n=500 d=16 k=150, Pair_simi, solver paper -> paper, on cpu")
    cost = r.stderr.index("train_mask: 40 learning steps of 16 masks")
    assert plan < cost < r.stderr.index("train_mask:   0%")
    assert "-step probe: about " in r.stderr
    # one ETA (the learner's), not tqdm's remaining time next to it
    lines = [ln for ln in r.stderr.replace("\r", "\n").splitlines() if "step/s" in ln]
    assert lines and not any(re.search(r"\[\d+:\d\d<", ln) for ln in lines)
    assert all(ln.count("eta=") == 1 for ln in lines if "f_mean=" in ln)
    # no temporary files left beside the outputs
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.parquet", "masks.parquet", "out.parquet"]


def test_cli_is_deterministic_and_resumes(shard, tmp_path):
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    ck = tmp_path / "ck.pt"
    assert run_cli("--input", str(shard), "--output", str(a), "--device", "cpu", *UPSTREAM).returncode == 0
    r = run_cli("--input", str(shard), "--output", str(b), "--device", "cpu", *UPSTREAM,
                "--checkpoint", str(ck), "--checkpoint-every", "10")
    assert r.returncode == 0, r.stderr
    assert pq.read_table(a).equals(pq.read_table(b))
    # a completed checkpoint is resumed (nothing left to do) and gives the same rows
    r2 = run_cli("--input", str(shard), "--output", str(b), "--device", "cpu", *UPSTREAM,
                 "--checkpoint", str(ck))
    assert json.loads(r2.stdout)["resumed_from"] == 40
    assert pq.read_table(a).equals(pq.read_table(b))


@pytest.mark.parametrize(
    "extra, msg",
    [
        (["--select_ratio", "1.5"], "select_ratio must be in (0, 1)"),
        (["--lamb", "2"], "lamb (lambda) must be in [0, 1]"),
        (["--algorithm", "kmeans"], "unknown algorithm 'kmeans'"),
        (["--device", "tpu:0"], "unknown device 'tpu:0'"),
        (["--partial", "0.002"], "needs k' >= 2"),
        (["--embedding-column", "emb", "--text-column", ""], "'emb'"),
    ],
)
def test_cli_bad_config_fails_fast_and_writes_nothing(shard, tmp_path, extra, msg):
    out = tmp_path / "out.parquet"
    r = run_cli("--input", str(shard), "--output", str(out), "--device", "cpu", *UPSTREAM, *extra)
    assert r.returncode == 2
    assert msg in r.stderr
    assert not out.exists()


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="machine has CUDA")
def test_cli_cuda_without_gpu_is_a_clear_error(shard, tmp_path):
    r = run_cli("--input", str(shard), "--output", str(tmp_path / "o.parquet"), "--device", "cuda:0")
    assert r.returncode == 2
    assert "CUDA is not available" in r.stderr


# ------------------------------------------------- cost, threads, one ETA (issue 20 item 20)
def test_threads_are_the_cores_not_already_busy():
    from datamask_pipeline.engine.cli import choose_threads

    assert choose_threads(3, environ={}) == (3, "--threads")
    assert choose_threads(0, environ={"OMP_NUM_THREADS": "4"}) == (None, "OMP_NUM_THREADS=4")
    # 2 cores: idle -> 2, one busy (the loaded machine of the issue) -> 1, overloaded -> 1
    assert choose_threads(0, environ={}, cores=2, load=0.1)[0] == 2
    assert choose_threads(0, environ={}, cores=2, load=1.0)[0] == 1
    assert choose_threads(0, environ={}, cores=2, load=7.5)[0] == 1
    n, why = choose_threads(0, environ={}, cores=16, load=3.6)
    assert n == 12 and why == "16 cores, load average 3.6"


def _progress(step, n_steps=10):
    from datamask_pipeline.engine.learner import Progress

    return Progress(step=step, n_steps=n_steps, lr=1.0, mean_f=0.5, best_f=0.6, mean_f_qua=0.7,
                    mean_f_div=0.1, elapsed_s=step * 0.1, eta_s=(n_steps - step) * 0.1)


def test_progress_bar_draws_the_last_line_once_with_one_eta():
    from datamask_pipeline.engine.cli import ProgressBar

    out = io.StringIO()
    bar = ProgressBar(stream=out)
    bar(_progress(5))
    time.sleep(1.1)  # past tqdm's mininterval: an update would draw the line, then close again
    bar(_progress(10))
    bar(_progress(10))  # a repeated last report draws nothing more
    lines = [ln for ln in out.getvalue().replace("\r", "\n").splitlines() if ln.strip()]
    assert sum("10/10" in ln for ln in lines) == 1, lines
    assert all(ln.count("eta=") <= 1 and "<" not in ln for ln in lines)
    assert "eta=00:00" in lines[-1]


def test_announce_states_the_cost_and_the_faster_route_on_cpu(monkeypatch):
    import numpy as np
    import torch

    from datamask_pipeline.engine import cli
    from datamask_pipeline.engine.config import LearnerConfig

    rng = np.random.default_rng(0)
    shard = type("S", (), {"n": 600, "d": 8, "embeddings": rng.normal(size=(600, 8)).astype(
        np.float32), "quality": rng.random(600)})()
    cfg = LearnerConfig(algorithm="Pair_simi", n_epochs=5000, n_rollout=16, partial=0.2)
    monkeypatch.setattr(cli, "learning_cost", lambda *a, **k: {
        "route": "paper", "steps": 5000, "probe_steps": 5, "seconds_per_step": 0.2,
        "learn_s": 1000.0})
    out = io.StringIO()
    cli.announce(shard, cfg, torch.device("cpu"), (1, "2 cores, load average 1.0"),
                 torch.float32, stream=out)
    text = out.getvalue()
    assert "on cpu, 1 torch thread(s) (2 cores, load average 1.0)" in text
    assert "5,000 learning steps of 16 masks" in text and "about 17 min of learning" in text
    assert "--profile pipeline" in text

    # a route without learning steps: no probe, and it says so
    out = io.StringIO()
    monkeypatch.undo()
    assert cli.announce(shard, cfg.replace(solver="topk+polish"), torch.device("cpu"),
                        (1, "x"), torch.float32, stream=out) is None
    assert "-> topk+polish" in out.getvalue() and "no learning steps" in out.getvalue()


def test_learning_cost_probe_is_near_the_run():
    import numpy as np
    import torch

    from datamask_pipeline.engine.cli import learning_cost
    from datamask_pipeline.engine.config import LearnerConfig
    from datamask_pipeline.engine.learner import learn

    rng = np.random.default_rng(1)
    shard = type("S", (), {"n": 2000, "d": 32, "embeddings": rng.normal(size=(2000, 32)).astype(
        np.float32), "quality": rng.random(2000)})()
    cfg = LearnerConfig(algorithm="DiSF", n_epochs=60, n_rollout=32, partial=0.1)
    cost = learning_cost(shard, cfg, torch.device("cpu"), torch.float32)
    assert cost["probe_steps"] == 5 and cost["steps"] == 60
    seen = []
    learn(shard.embeddings, shard.quality, cfg, device="cpu",
          progress=lambda p: seen.append(p.elapsed_s), progress_every=1)
    actual = seen[-1]
    # a loose bound: the machine is shared, but an estimate off by 5x would mislead
    assert actual / 5 < cost["learn_s"] < actual * 5, (cost, actual)
