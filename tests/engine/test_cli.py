"""The engine's upstream-compatible command line, run as a subprocess."""

import json
import os
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
