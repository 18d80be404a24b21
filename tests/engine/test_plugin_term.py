"""A diversity term from a package of its own (tests/plugin_term), found through the
entry-point group ``datamask.diversity_terms`` and run through ``train_mask``."""

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from datamask_pipeline.engine.sample import make_table
from tests.plugin_term.install import install_plugin


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory):
    return install_plugin(tmp_path_factory.mktemp("plugin") / "site")


def _cli(args, plugin_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_path), os.getcwd()])}
    return subprocess.run([sys.executable, "-m", "datamask_pipeline.engine.cli", *args],
                          capture_output=True, text=True, timeout=300, env=env)


def test_plugin_term_runs_through_train_mask(plugin_path, tmp_path):
    src = tmp_path / "in.parquet"
    pq.write_table(make_table(600, dim=16, seed=2), src)
    out = tmp_path / "out.parquet"
    r = _cli(["--input", str(src), "--output", str(out), "--device", "cpu",
              "--algorithm", "dispersion", "--n_epochs", "30", "--n_rollout", "16",
              "--partial", "0.2", "--select_ratio", "0.1", "--no-progress"], plugin_path)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout)
    assert summary["term"] == "Dispersion" and summary["k"] == 60
    got = pq.read_table(out)
    assert got.num_rows == 60 and got.schema == pq.read_table(src).schema
    obj = summary["objective"]
    assert np.isfinite(obj["selection"]["f_div"]) and 0.0 <= obj["selection"]["f_div"] <= 1.0


def test_plugin_term_mixes_with_a_builtin_and_auto_falls_back(plugin_path, tmp_path):
    src = tmp_path / "in.parquet"
    pq.write_table(make_table(500, dim=16, seed=3), src)
    r = _cli(["--input", str(src), "--output", str(tmp_path / "o.parquet"), "--device", "cpu",
              "--terms", "Dispersion=1,Pair_simi=0.5", "--solver", "auto", "--n_epochs", "20",
              "--n_rollout", "16", "--partial", "0.2", "--no-progress"], plugin_path)
    assert r.returncode == 0, r.stderr[-3000:]
    summary = json.loads(r.stdout)
    assert summary["term"] == "1·Dispersion + 0.5·Pair_simi"
    # the mixture has no swap moves: auto's choice runs as the learner, and says so
    assert summary["route"] == "paper" and any("no polish" in n for n in summary["notes"])
    # the guard: never below quality top-k on the whole shard
    assert summary["objective"]["selection"]["f"] >= summary["objective"]["quality_topk"]["f"]


def test_unknown_term_names_the_registered_ones(plugin_path, tmp_path):
    src = tmp_path / "in.parquet"
    pq.write_table(make_table(200, dim=8, seed=4), src)
    r = _cli(["--input", str(src), "--output", str(tmp_path / "o.parquet"), "--algorithm",
              "nope"], plugin_path)
    assert r.returncode == 2
    assert "unknown algorithm 'nope'" in r.stderr and "Dispersion" in r.stderr
