"""bench/gpu.sh calibrates ``auto`` for its device (issue 20 item 10): after the engine stages
it runs ``bench.solvers --write-table`` into a table that keeps the other devices' rules. The
dry run does it on the CPU into a copy of the committed table, never into the committed one."""

import json
import os
import subprocess
from pathlib import Path

from datamask_pipeline.engine import solver_table

REPO = Path(__file__).resolve().parents[2]


def test_dry_run_merges_a_table_into_out_and_leaves_the_committed_one(tmp_path):
    committed = solver_table.TABLE_PATH.read_text()
    out = tmp_path / "out"
    env = dict(os.environ, OMP_NUM_THREADS="1", OUT=str(out), DRY="1", TERMS="Pair_simi",
               STEPS="2")
    proc = subprocess.run(["bash", str(REPO / "bench" / "gpu.sh")], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert solver_table.TABLE_PATH.read_text() == committed
    table = json.loads((out / "solver_table.json").read_text())
    old = json.loads(committed)
    assert table["rules"]["cpu"]["DiSF"] == old["rules"]["cpu"]["DiSF"]  # not measured: kept
    assert table["rules"]["cpu"]["Facility"] == old["rules"]["cpu"]["Facility"]
    pair = table["rules"]["cpu"]["Pair_simi"]
    assert len(pair) == 1 and "measured at n=1500" in pair[0]["why"]
    assert "bench.solvers --quick" in table["sources"]["cpu"]["command"]
    assert (out / "results_solvers_gpu.json").exists()
    assert "auto's table for this device merged" in proc.stderr
