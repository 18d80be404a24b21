"""CI smoke run of the benchmark suite: it runs in seconds on a tiny shard and writes valid JSON
with the expected keys and a markdown report. No timing is asserted, ever."""

import json
import math

from bench.run import main

TERMS = ("DiSF", "Facility", "Pair_simi")


def _finite_or_none(obj):
    if isinstance(obj, dict):
        return all(_finite_or_none(v) for v in obj.values())
    if isinstance(obj, list):
        return all(_finite_or_none(v) for v in obj)
    if isinstance(obj, float):
        return math.isfinite(obj)
    return True


def test_quick_mode_writes_json_and_report(tmp_path):
    rc = main(["--mode", "quick", "--out", str(tmp_path), "--sizes", "400", "--dim", "16",
               "--steps", "12", "--rollouts", "8", "--polish-budget-s", "20"])
    assert rc == 0
    res = json.loads((tmp_path / "results_quick.json").read_text())
    assert _finite_or_none(res)
    for key in ("schema_version", "mode", "command", "machine", "data", "settings", "time_to_greedy",
                "term_norm", "hardware", "speedups", "pipeline", "defaults", "total_s"):
        assert key in res, key
    for key in ("cpu_count", "cpu_model", "torch", "numpy", "pyarrow", "device"):
        assert key in res["machine"], key
    cells = res["time_to_greedy"]["cells"]
    assert sorted(c["term"] for c in cells) == sorted(TERMS)
    for c in cells:
        for key in ("n", "d", "k", "f_topk", "f_random", "greedy", "paper", "paper+polish",
                    "topk+polish", "greedy+polish"):
            assert key in c, key
        assert c["n"] == 400 and c["k"] == 40
        assert set(c["paper"]["time_to"]) >= {"0.99", "0.995", "1"}
        assert c["paper"]["curve"] and c["paper+polish"]["curve"]
        assert c["greedy"]["measured"] and c["greedy"]["f"] is not None
        # polish never lowers the whole-shard objective (a property, not a timing)
        assert c["paper+polish"]["f"] >= c["paper"]["final_f"] - 1e-6
    assert {r["term"] for r in res["term_norm"]["rows"]} == set(TERMS)
    assert res["hardware"]["peaks"]["matmul_gflops"] > 0 and res["hardware"]["kernels"]
    assert res["speedups"] and all("speedup" in r for r in res["speedups"])
    assert "skipped" in res["pipeline"]
    assert set(res["defaults"]) == set(TERMS)
    report = (tmp_path / "REPORT.md").read_text()
    assert "python -m bench.run --mode quick" in report and "## Machine" in report


def test_parquet_input(tmp_path):
    import pyarrow.parquet as pq

    from datamask_pipeline.engine.sample import make_table

    shard = tmp_path / "shard.parquet"
    pq.write_table(make_table(300, dim=8, seed=4), shard)
    out = tmp_path / "out"
    rc = main(["--mode", "quick", "--out", str(out), "--parquet", str(shard), "--sizes", "300",
               "--steps", "8", "--rollouts", "8", "--terms", "Pair_simi",
               "--skip", "term_norm,hardware,speedups,pipeline"])
    assert rc == 0
    res = json.loads((out / "results_quick.json").read_text())
    assert res["data"]["kind"] == "parquet" and res["data"]["rows"] == 300
    assert [c["term"] for c in res["time_to_greedy"]["cells"]] == ["Pair_simi"]


def test_solvers_section_quick_writes_json_report_and_table(tmp_path):
    """bench.solvers --quick through select_shard: every solver and greedy per term, valid
    JSON, the markdown report, and a solver table in the engine's format (written to a temporary
    path here: the committed table comes from the recorded run)."""
    from bench import solvers
    from datamask_pipeline.engine import solver_table

    rc = solvers.main(["--quick", "--sizes", "600", "--out", str(tmp_path), "--tag", "t"])
    assert rc == 0
    res = json.loads((tmp_path / "results_t.json").read_text())
    assert _finite_or_none(res)
    assert {c["term"] for c in res["cells"]} == set(TERMS)
    for c in res["cells"]:
        assert set(c["solvers"]) == set(solvers.SOLVERS) | {"greedy"}
        for r in c["solvers"].values():
            # every solver but the plain learner is guarded: never below quality top-k
            assert r["f"] >= c["f_topk"] - 1e-9 or r is c["solvers"]["paper"]
    assert "| n | greedy time | solver |" in (tmp_path / "REPORT_t.md").read_text()
    table = solvers.build_table(res["cells"], res["command"], "x.json")
    for term in TERMS:
        row = table["rules"]["cpu"][term][0]
        assert row["solver"] in solvers.SOLVERS and row["max_n"] >= 600
    # the committed table parses and covers the built-in terms
    committed = solver_table.load()
    assert set(committed["rules"]["cpu"]) >= set(TERMS)
