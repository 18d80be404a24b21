"""``bench.solvers --write-table`` merges its device's rules into the table and keeps the
rest (issue 20 item 10). A tiny run; the committed table itself is never written here."""

import json

from bench import solvers
from datamask_pipeline.engine import solver_table


def test_write_table_merges_the_measured_device_and_keeps_the_others(tmp_path):
    table = solver_table.merge(solver_table.load(), "cuda",
                               {"DiSF": [{"max_n": 10**12, "solver": "paper+polish",
                                          "why": "gpu", "lamb": 0.5}]},
                               {"command": "gpu", "results": "gpu.json"})
    path = tmp_path / "table.json"
    path.write_text(json.dumps(table))
    committed_before = solver_table.TABLE_PATH.read_text()
    rc = solvers.main(["--quick", "--sizes", "300", "--terms", "Pair_simi", "--lamb", "0.2",
                       "--solvers", "paper,topk+polish", "--out", str(tmp_path), "--tag", "t",
                       "--write-table", "--table", str(path)])
    assert rc == 0
    assert solver_table.TABLE_PATH.read_text() == committed_before
    new = json.loads(path.read_text())
    assert new["rules"]["cuda"] == table["rules"]["cuda"]
    assert new["sources"]["cuda"] == table["sources"]["cuda"]
    assert new["rules"]["cpu"]["DiSF"] == table["rules"]["cpu"]["DiSF"]
    pair = new["rules"]["cpu"]["Pair_simi"]
    # the λ = 0.2 rows were added; the committed λ = 0.5 rows stay
    assert [r for r in pair if r["lamb"] == 0.5] == table["rules"]["cpu"]["Pair_simi"]
    added = [r for r in pair if r["lamb"] == 0.2]
    assert len(added) == 1 and added[0]["max_n"] == 10**12
    assert added[0]["solver"] in ("paper", "topk+polish")
    assert "--write-table" in new["sources"]["cpu"]["command"]
    assert solver_table.choose({"Pair_simi": 1}, 300, "cpu", 0.2, table=new)[0] == added[0]["solver"]
