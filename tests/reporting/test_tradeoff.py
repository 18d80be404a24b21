"""The lambda trade-off sweep, its plot and its command line."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from datamask_pipeline.engine import sample, storage
from datamask_pipeline.engine.baselines import quality_topk, random_selection
from datamask_pipeline.engine.config import ConfigError, LearnerConfig
from datamask_pipeline.engine.evaluate import evaluate_selection
from datamask_pipeline.reporting import plot_frontier, sweep_lambda
from datamask_pipeline.reporting.tradeoff import main, parse_lambs

from .test_shard_report import _png_image

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
N, DIM = 300, 16
CFG = LearnerConfig(algorithm="Pair_simi", select_ratio=0.1, n_epochs=30, n_rollout=16,
                    partial=0.3)


@pytest.fixture(scope="module")
def shard():
    t = sample.make_table(N, dim=DIM, seed=3)
    x = np.asarray(t["feature_arr"].combine_chunks().values).reshape(N, DIM).copy()
    return t, x, t["quality_score"].to_numpy().copy(), t["chunk_id"].to_numpy().copy()


@pytest.fixture(scope="module")
def sweep(shard):
    _, x, q, ids = shard
    msgs = []
    out = sweep_lambda(x, q, "pairwise", "1, 0.5,0,0.5", CFG, ids=ids, progress=msgs.append)
    out["_msgs"] = msgs
    return out


def _finite(obj):
    if isinstance(obj, dict):
        return all(_finite(v) for v in obj.values())
    if isinstance(obj, list):
        return all(_finite(v) for v in obj)
    if isinstance(obj, float):
        return math.isfinite(obj)
    return True


def test_parse_lambs():
    assert parse_lambs("0.5, 0,1,0.5") == [0.0, 0.5, 1.0]
    assert parse_lambs([0.2]) == [0.2]
    for bad in ("", "0,1.5", "a,b", [-0.1], "nan"):
        with pytest.raises(ValueError):
            parse_lambs(bad)


def test_sweep_scores_every_lambda_on_the_whole_shard(sweep, shard):
    _, x, q, ids = shard
    assert sweep["algorithm"] == "Pair_simi" and sweep["lambs"] == [0.0, 0.5, 1.0]
    assert (sweep["n"], sweep["d"], sweep["k"]) == (N, DIM, 30)
    assert [p["lamb"] for p in sweep["points"]] == [0.0, 0.5, 1.0]
    assert [p["lamb"] for p in sweep["greedy"]] == [0.0, 0.5, 1.0]
    k = sweep["k"]
    topk = evaluate_selection(x, q, quality_topk(q, k, ids), terms=("Pair_simi",))
    rnd = evaluate_selection(x, q, random_selection(N, k, seed=CFG.seed), terms=("Pair_simi",))
    assert sweep["quality_topk"]["f_qua"] == pytest.approx(topk["f_qua"])
    assert sweep["quality_topk"]["f_div"] == pytest.approx(topk["f_div"]["Pair_simi"])
    assert sweep["random"]["f_div"] == pytest.approx(rnd["f_div"]["Pair_simi"])
    for p in sweep["points"] + sweep["greedy"]:
        lam = p["lamb"]
        assert p["f"] == pytest.approx(lam * p["f_qua"] + (1 - lam) * p["f_div"])
    for p in sweep["points"]:
        lam = p["lamb"]
        assert p["f_quality_topk"] == pytest.approx(lam * topk["f_qua"] + (1 - lam) * topk["f_div"]["Pair_simi"])
        # lambda = 1 is read out as the exact quality top-k, with no learner steps
        assert p["steps"] == (0 if lam == 1.0 else CFG.n_epochs) and p["wall_time_s"] >= 0
        assert "f_greedy" in p
    # lambda = 1 is pure quality: the learner reads out quality top-k exactly, and so does greedy
    one = sweep["points"][-1]
    assert one["overlap_with_topk"] == 1.0 and one["f_qua"] == pytest.approx(topk["f_qua"])
    assert sweep["greedy"][-1]["f_qua"] == pytest.approx(topk["f_qua"])
    assert "gap_closed_vs_greedy" not in one  # greedy = top-k there: 0/0 is left out
    # no subset of size k has a higher mean quality than top-k
    assert all(p["f_qua"] <= topk["f_qua"] + 1e-9 for p in sweep["points"] + sweep["greedy"])
    # the diversity-only runs are more diverse than quality top-k on this shard
    assert sweep["points"][0]["f_div"] > topk["f_div"]["Pair_simi"]
    assert sweep["greedy"][0]["f_div"] > topk["f_div"]["Pair_simi"]
    assert _finite(sweep)
    json.dumps({k: v for k, v in sweep.items() if k != "_msgs"}, allow_nan=False)
    assert len(sweep["_msgs"]) == 6 and any("DATAMASK λ=0.5" in m for m in sweep["_msgs"])
    assert "lamb" not in sweep["config"] and sweep["config"]["n_epochs"] == CFG.n_epochs


def test_greedy_lambs_and_validation(shard):
    _, x, q, ids = shard
    small = CFG.replace(n_epochs=5)
    out = sweep_lambda(x, q, "Pair_simi", [0.2, 0.7], small, ids=ids, greedy_lambs="none")
    assert out["greedy"] == [] and not any("f_greedy" in p for p in out["points"])
    _png_image(plot_frontier(out))  # a frontier without greedy points still draws
    out = sweep_lambda(x, q, "Pair_simi", [0.2, 0.7], small, greedy_lambs=[0.7])
    assert [p["lamb"] for p in out["greedy"]] == [0.7]
    assert "f_greedy" in out["points"][1] and "f_greedy" not in out["points"][0]
    calls = []
    with pytest.raises(ConfigError, match="partial"):  # checked before any run starts
        sweep_lambda(x, q, "Pair_simi", [0.5], CFG.replace(partial=0.01), progress=calls.append)
    assert calls == []


def test_plot_frontier_png(sweep):
    png = plot_frontier(sweep, title="tiny <shard>")
    img = _png_image(png)
    assert img.size[0] >= 1000 and img.size[1] >= 450
    assert np.asarray(img.convert("L")).std() > 5


def test_command_line_writes_png_and_json(shard, tmp_path):
    table, *_ = shard
    src = str(tmp_path / "tiny.parquet")
    storage.atomic_write_table(table, src)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "datamask_pipeline.reporting.tradeoff", "--input", src,
           "--algorithm", "Pair_simi", "--lambs", "0,0.5,1", "--out", str(out),
           "--n_epochs", "20", "--n_rollout", "8", "--partial", "0.3"]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert sorted(os.listdir(out)) == ["frontier_Pair_simi.json", "frontier_Pair_simi.png"]
    assert summary["png"].endswith("frontier_Pair_simi.png") and os.path.exists(summary["png"])
    _png_image(open(out / "frontier_Pair_simi.png", "rb").read())

    def strict(c):
        raise ValueError(c)

    data = json.loads(open(out / "frontier_Pair_simi.json").read(), parse_constant=strict)
    assert [p["lamb"] for p in data["points"]] == [0.0, 0.5, 1.0]
    assert [p["lamb"] for p in data["greedy"]] == [0.0, 0.5, 1.0]
    assert data["config"]["n_epochs"] == 20 and data["input"] == src
    assert [p["f"] for p in summary["points"]] == [p["f"] for p in data["points"]]
    assert "DATAMASK λ=0.5" in proc.stderr


def test_command_line_rejects_bad_input(shard, tmp_path, capsys):
    table, *_ = shard
    src = str(tmp_path / "tiny.parquet")
    storage.atomic_write_table(table, src)
    out = tmp_path / "out"
    assert main(["--input", src, "--out", str(out), "--lambs", "0,2"]) == 2
    assert "[0, 1]" in capsys.readouterr().err
    assert main(["--input", str(tmp_path / "missing.parquet"), "--out", str(out)]) == 2
    assert main(["--input", src, "--out", str(out), "--algorithm", "nope"]) == 2
    assert "unknown algorithm" in capsys.readouterr().err
    assert not out.exists()  # nothing is written when the run cannot start
