"""Smoke run of bench.dedup main_job: the README's main job (a subprocess) on id+text files
with planted copies; the result's counts are recomputed here from the files it wrote."""

import json

import numpy as np
import pyarrow.parquet as pq

from bench import dedup


def test_main_job_bench_counts_what_the_main_job_selected(tmp_path):
    rc = dedup.main(["main_job", "--pairs", "20", "--files", "3", "--workdir",
                     str(tmp_path / "work"), "--tag", "smoke", "--out", str(tmp_path)])
    assert rc == 0
    r = json.loads((tmp_path / "results_smoke.json").read_text())
    assert (tmp_path / "REPORT_smoke.md").read_text().endswith(dedup.main_job_markdown(r) + "\n")
    assert set(r["variants"]) == {name for name, _ in dedup.MAIN_JOB_VARIANTS}
    default = r["variants"]["main job (default)"]
    # the main job wrote exactly the budget under selected/, every id once
    root = tmp_path / "work" / "main_job"
    ids = np.concatenate([pq.read_table(f, columns=["id"]).column("id").to_numpy(
        zero_copy_only=False) for f in sorted((root / "selected").glob("*.parquet"))])
    assert ids.size == default["selected"] == default["distinct"] == r["budget_rows"]
    assert np.unique(ids).size == ids.size
    # the input files hold only id and text
    assert sorted(pq.read_schema(root / "part_0.parquet").names) == ["id", "text"]
    assert default["planted_pairs_both_selected"] == 0
