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
    for name, m in res["sources"].items():  # issue 25's bar (lowest here: docstrings 0.915)
        assert m["auc"][f"combination:{Q.COMBINATION}"]["all"] >= 0.9, name
        assert {f"combination:{c}" for c in Q.COMBINATIONS} <= set(m["auc"])
        assert m["good_at_1"] == 0.0
    assert res["throughput"]["docs_per_s_per_core"] > 0
    report = (tmp_path / "REPORT_quality.md").read_text()
    assert res["command"] in report and "documents/s per core" in report


def test_auc_counts_ties_half():
    assert bench_quality._auc([1, 2], [0, 0]) == 1.0
    assert bench_quality._auc([1], [1]) == 0.5
    assert bench_quality._auc([0, 2], [1, 1]) == 0.5


def test_main_job_run_counts_real_pages_in_what_the_main_job_selected(tmp_path):
    """bench.quality --main-job at a small size: the README's main job (a subprocess) selects
    the budget from id+text files in two languages; the measure is recomputed from its files."""
    import numpy as np
    import pyarrow.parquet as pq
    import pytest

    if not bench_quality.man_docs(1) or not bench_quality.man_docs(1, lang="de"):
        pytest.skip("no English and German man pages on this machine (man, /usr/share/man)")
    r = bench_quality.run_main_job(10, 2, 0, str(tmp_path), algorithms=("Pair_simi",),
                                   languages=("en", "de"))
    v = r["algorithms"]["Pair_simi"]
    assert r["rows"] == 40 and r["budget_rows"] == 4 == v["selected"]
    ids = np.concatenate([pq.read_table(f, columns=["id"]).column("id").to_numpy(
        zero_copy_only=False) for f in sorted((tmp_path / "Pair_simi" / "selected").glob("*.parquet"))])
    # rows 0-9 and 20-29 are the real pages (each language: 10 real, then 10 damaged)
    real = np.array([(int(i[3:]) % 20) < 10 for i in ids])
    assert ids.size == 4 and v["damaged_share"] == 1 - real.mean()
    assert set(v["languages"]) == {"en", "de"} and r["computed_quality_rows"] == 40
    assert set(r["by_combination"]) == set(Q.COMBINATIONS)
    assert bench_quality.main_job_markdown(r).count("\n| ") >= 2 + len(Q.COMBINATIONS)
