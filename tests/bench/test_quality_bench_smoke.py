"""CI smoke run of bench/quality.py on a small sample: the JSON and the report are written, the
default combination separates good from bad on every source, and the report names its command.
No timing is asserted."""

import json

from bench import quality as bench_quality
from datamask_pipeline.engine import quality as Q


def test_quick_run_writes_json_and_report(tmp_path):
    assert bench_quality.main(["--quick", "--out", str(tmp_path)]) == 0
    res = json.loads((tmp_path / "results_quality.json").read_text())
    assert res["default"] == {"combination": Q.COMBINATION, "signals": list(Q.DEFAULT_SIGNALS)}
    for name, m in res["sources"].items():
        assert m["auc"][f"combination:{Q.COMBINATION}"]["all"] > 0.9, name
        assert set(m["auc"]) >= {s.name for s in Q.SIGNALS}
    assert set(res["choice"]) == set(Q.COMBINATIONS)
    assert res["throughput"]["docs_per_s_per_core"] > 0
    report = (tmp_path / "REPORT_quality.md").read_text()
    assert res["command"] in report and "documents/s per core" in report


def test_auc_counts_ties_half():
    assert bench_quality._auc([1, 2], [0, 0]) == 1.0
    assert bench_quality._auc([1], [1]) == 0.5
    assert bench_quality._auc([0, 2], [1, 1]) == 0.5
