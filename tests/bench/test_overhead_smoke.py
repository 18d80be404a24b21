"""Smoke run of bench/overhead.py: one interleaved rep on a tiny shard (the real commands,
``dagster asset materialize`` and the engine CLI), the JSON's shape and the report. The profile
parser runs on a real cProfile file. No timing is asserted, ever."""

import cProfile
import json

from bench import overhead


def test_overhead_rep_writes_json_and_report(tmp_path):
    rc = overhead.main(["--out", str(tmp_path), "--work", str(tmp_path / "work"), "--rows", "400",
                        "--dim", "16", "--n-epochs", "3", "--n-rollout", "8", "--reps", "1",
                        "--skip", "profile,multiprocess"])
    assert rc == 0
    res = json.loads((tmp_path / "results_overhead.json").read_text())
    for key in ("schema_version", "command", "machine", "settings", "overhead", "profile",
                "multiprocess", "total_s"):
        assert key in res, key
    ov = res["overhead"]
    assert ov["shard_report_included"] is False and ov["threads"] == 1
    assert ov["config"]["solver"] == "paper" and ov["config"]["n_epochs"] == 3
    assert "asset materialize -m datamask_pipeline.definitions --select " \
           "features,mask,selected_subset --partition shard_000" in ov["commands"]["dagster"]
    assert "datamask_pipeline.engine.cli" in ov["commands"]["engine_cli"]
    assert "--threads 1" in ov["commands"]["engine_cli"]
    assert ov["env"]["DATAMASK_CPU_THREADS"] == "1" and ov["env"]["OMP_NUM_THREADS"] == "1"
    (rep,) = ov["reps"]
    assert rep["order"] == ["cli", "dagster"]
    for side in ("cli", "dagster"):
        assert rep[side]["wall_s"] > 0 and rep[side]["cpu_s"] > 0, side
        assert rep[side]["learn_s"] is not None, side
        assert len(rep[side]["loadavg_before"]) == 3, side
    # the chain is four steps in one process: the asset check is a step of its own
    assert rep["dagster"]["steps"] == 4
    # each step's own duration, from the run's STEP_SUCCESS events in the instance
    assert set(rep["dagster"]["steps_s"]) == {"features", "validate_features", "mask",
                                             "selected_subset"}
    assert all(0 < v < rep["dagster"]["wall_s"] for v in rep["dagster"]["steps_s"].values())
    for m in ("ratio_wall", "ratio_cpu", "ratio_learn", "fixed_extra_wall_s"):
        assert rep[m] is not None, m
        assert ov["summary"][m]["median"] == round(rep[m], 4), m
    assert set(ov["verdict"]) == {"ratio_wall", "ratio_cpu", "ratio_wall_learning_equalised"}
    md = (tmp_path / "REPORT_overhead.md").read_text()
    assert "## Overhead: the chain against the engine CLI" in md
    assert ov["commands"]["dagster"] in md


def test_profile_parts_names_the_engine_functions(tmp_path):
    from datamask_pipeline.engine.data import read_shard
    from datamask_pipeline.engine.sample import generate_corpus

    (raw,) = generate_corpus(str(tmp_path / "raw"), n_shards=1, rows_per_shard=200, dim=8, seed=0)
    prof = cProfile.Profile()
    prof.runcall(read_shard, raw)
    prof.dump_stats(str(tmp_path / "p.prof"))
    parts = overhead.profile_parts(str(tmp_path / "p.prof"), top=5)
    assert parts["total_s"] > 0
    assert 0 < parts["parts"]["read shard (engine read_shard)"] <= parts["total_s"] + 1e-3
    assert "learning (engine learn)" not in parts["parts"]
    assert len(parts["top_cumulative"]) <= 5


def test_verdict_tells_every_rep_from_the_median():
    def s(xs):
        return {"ratio_wall": overhead._spread(xs)}

    assert overhead.verdict(s([1.02, 1.05, 1.08]))["ratio_wall"]["reads"] == "within 10% in every rep"
    assert overhead.verdict(s([1.02, 1.05, 1.30]))["ratio_wall"]["reads"] == \
        "median within 10%, not every rep"
    assert overhead.verdict(s([1.2, 1.3, 1.4]))["ratio_wall"]["reads"] == "above 10% in every rep"
    assert overhead.verdict(s([1.05, 1.2, 1.4]))["ratio_wall"]["reads"] == \
        "median above 10%, not every rep"


def test_cli_command_refuses_a_knob_it_would_not_pass():
    import pytest

    cfg = overhead.knobs(5, 8)
    cmd = overhead.cli_cmd("raw.parquet", "out.parquet", cfg, 1)
    assert cmd[cmd.index("--n_epochs") + 1] == "5" and cmd[cmd.index("--threads") + 1] == "1"
    with pytest.raises(ValueError, match="prune_ratio"):
        overhead.cli_cmd("raw.parquet", "out.parquet", {**cfg, "prune_ratio": 0.2}, 1)
