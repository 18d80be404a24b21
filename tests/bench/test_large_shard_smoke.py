"""CI smoke run of bench/large_shard.py: a 400 × 16 shard through features, mask and
selected_subset for every term, each in its own Dagster instance, valid JSON and a report.
No timing is asserted."""

import json

from bench import large_shard


def test_quick_run_writes_json_and_report(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    assert large_shard.main(["--quick", "--out", str(out), "--workdir", str(work)]) == 0
    res = json.loads((out / "results_large_shard_quick.json").read_text())
    assert res["rows"] == 400 and set(res["terms"]) == {"Pair_simi", "Facility", "DiSF"}
    for term, r in res["terms"].items():
        assert r["rc"] == 0 and not r.get("refused"), term
        assert {"features", "mask", "selected_subset"} <= set(r["steps_s"]), term
        assert r["n"] == 400 and r["k"] == 40 and r["route"], term
        assert r["peak_rss_bytes"] > 50 << 20 and r["cpu_s"] > 0, term
        sel = r["scores"].get("datamask") or r["scores"]["selection"]
        # the guarded default never returns less than quality top-k on the whole shard
        assert sel["f"] >= r["scores"]["quality_topk"]["f"] - 1e-9, term
        ref = r["reference"]
        assert {"stochastic_greedy", "greedy"} <= set(ref), term  # 400 rows: exact greedy too
        assert ref["greedy"]["f"] >= ref["stochastic_greedy"]["f"] - 0.05, term
    report = (out / "REPORT_large_shard_quick.md").read_text()
    assert res["command"] in report and "| DiSF |" in report
    assert not (work / "raw_once").exists()  # the generated shard is removed after the run


def test_a_refused_term_is_recorded_with_the_preflight_message(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    # k = round(0.9999 · 400) = n leaves nothing to choose: the pre-flight refuses the step
    rc = large_shard.main(["--quick", "--terms", "Pair_simi", "--no-reference", "--out", str(out),
                           "--workdir", str(work), "--knob", "select_ratio=0.9999"])
    res = json.loads((out / "results_large_shard_quick.json").read_text())
    r = res["terms"]["Pair_simi"]
    assert r["rc"] != 0 and "select_ratio" in r["refused"]
    assert "refused" in (out / "REPORT_large_shard_quick.md").read_text()
    assert rc == 0
