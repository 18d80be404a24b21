"""CI smoke run of bench/efficiency.py: one round on a 2000 × 32 shard, valid JSON and a report.
No timing or fraction is asserted beyond being a positive finite number."""

import json
import math

from bench import efficiency


def test_quick_run_writes_json_and_report(tmp_path):
    assert efficiency.main(["--quick", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "results_efficiency.json").read_text())
    assert res["rounds"] == 1 and len(res["per_round"]) == 1
    pk = res["per_round"][0]["peaks"]
    assert pk["matmul_gflops"] == max(pk["before"]["matmul_gflops"], pk["after"]["matmul_gflops"])
    kinds = {s["bound"] for s in res["summary"]}
    assert kinds == {"compute", "memory"}
    for s in res["summary"]:
        assert math.isfinite(s["median"]) and s["min"] <= s["median"] <= s["max"] and s["median"] > 0
        if s["bound"] == "memory":
            assert s["limit"], s["kernel"]  # every memory-bound kernel names what bounds it
            assert s["meets_target"] is None
        else:
            assert s["meets_target"] == (s["median"] >= efficiency.TARGET)
    report = (tmp_path / "REPORT_efficiency.md").read_text()
    assert res["command"] in report and "DiSF objective" in report


def test_summary_takes_median_and_spread_over_rounds():
    def rnd(frac):
        return {"kernels": [{"kernel": "DiSF objective, x", "bound": "compute", "gflops": frac * 100,
                             "fraction_of_matmul": frac}]}
    s = efficiency.summarize([rnd(0.4), rnd(0.6), rnd(0.55)])[0]
    assert (s["median"], s["min"], s["max"]) == (0.55, 0.4, 0.6) and s["meets_target"]
