"""CI smoke run of bench/throughput.py: a tiny shard, every variant in its own process, valid
JSON and a report. No timing is asserted."""

import json
import math

import pytest

from bench import throughput


def test_quick_run_writes_json_and_report(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    rc = throughput.main(["--quick", "--out", str(out), "--work", str(work)])
    assert rc == 0
    res = json.loads((out / "results_throughput.json").read_text())
    assert res["rows"] == 2000 and res["reps"] == 1
    expected = {v for ours, raws in throughput.FAMILIES.values() for v in (ours, *raws)}
    assert set(res["variants"]) == expected
    for name, v in res["variants"].items():
        assert v["rows"] == 2000, name  # every variant read the whole shard
        assert v["reps"] == 1 and len(v["wall_s"]) == 1
        assert v["median_s"] > 0 and math.isfinite(v["mb_per_s"])
        # the step's peak is at least what the process held after its imports
        assert v["peak_rss_mib"] >= v["rss_after_imports_mib"] > 10
    # the subset variants wrote the 10% selection
    assert res["variants"]["subset_ours"]["out_bytes"] > 0
    assert set(res["families"]) == set(throughput.FAMILIES)
    for fam in res["families"].values():
        for c in fam["vs"].values():
            assert c["meets_target"] == (c["throughput_ratio"] >= throughput.TARGET)
    report = (out / "REPORT_throughput.md").read_text()
    assert res["command"] in report and "ours/raw" in report
    assert len(res["machine"]["loadavg_start"]) == 3


def test_unknown_family_is_refused(tmp_path):
    with pytest.raises(SystemExit):
        throughput.main(["--quick", "--families", "validation,nope", "--out", str(tmp_path)])


def test_summary_ratio_is_raw_time_over_ours(tmp_path):
    paths = {}
    for name in ("raw", "features"):
        p = tmp_path / f"{name}.parquet"
        p.write_bytes(b"x" * 1000)
        paths[name] = str(p)
    rec = lambda s: {"rows": 100, "wall_s": s, "cpu_s": s, "peak_rss_bytes": 2**20,  # noqa: E731
                     "rss_after_imports_bytes": 2**20}
    runs = {"subset_ours": [rec(4.0), rec(2.0), rec(3.0)],
            "subset_raw_pyarrow": [rec(1.0), rec(1.0), rec(1.0)]}
    s = throughput.summarize(runs, paths)
    assert s["variants"]["subset_ours"]["median_s"] == 3.0
    assert s["variants"]["subset_ours"]["mb_per_s"] == pytest.approx(1000 / 1e6 / 3.0)
    c = s["families"]["subset"]["vs"]["subset_raw_pyarrow"]
    assert c["throughput_ratio"] == pytest.approx(1 / 3) and not c["meets_target"]
    assert "validation" not in s["families"]
