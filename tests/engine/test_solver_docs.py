"""The documented solver tables come from the routing code, the committed table and the
committed results (issue 20 item 12): each assertion fails when the docs, the table or
``engine.select.route_for`` changes without the others. The route table is on
docs/reference/solvers.md, the measured table on docs/measured.md, the opening on the README
and docs/index.md."""

import json
from pathlib import Path

from bench.solvers import auto_route, best_route, build_rules, readme_table
from datamask_pipeline.engine import routes, solver_table
from datamask_pipeline.engine.config import LearnerConfig
from datamask_pipeline.engine.select import route_for
from tests.doc_pages import flat, page, site_pages

REPO = Path(__file__).resolve().parents[2]
SOLVERS = page("reference/solvers.md")
MEASURED = page("measured.md")


def _cells():
    src = solver_table.load()["sources"]["cpu"]
    return json.loads((REPO / src["results"]).read_text())["cells"]


def test_readme_route_table_is_rendered_from_route_for():
    assert routes.routes_markdown() in SOLVERS


def test_committed_table_is_the_committed_results():
    """The CPU rules are what build_rules makes of the results the table names."""
    assert build_rules(_cells()) == solver_table.load()["rules"]["cpu"]


def test_measured_table_says_what_auto_runs_now():
    assert readme_table(_cells()) in MEASURED
    for c in _cells():
        cfg = LearnerConfig.profile("pipeline", algorithm=c["term"])
        now = route_for(cfg, c["n"], "cpu")[0]
        row = next(line for line in MEASURED.splitlines()
                   if line.startswith(f"| {c['term']} | {c['n']:,} | ") and "% time" in line)
        last = row.rstrip(" |").rsplit("| ", 1)[1]
        assert last.startswith(f"`{now}`"), (row, now)
        if now != best_route(c)["solver"]:
            assert "not measured here" in last


def test_facility_switch_point_is_the_code_and_the_readme_says_it():
    pts = routes.switch_points("Facility")
    assert [r for _, r in pts] == ["topk+polish", "greedy"]
    n = pts[1][0]
    # the sparse similarity begins where n x n float32 exceeds half the 256 MiB CPU budget
    assert n * n * 4 * 2 > 256 << 20 >= (n - 1) * (n - 1) * 4 * 2
    assert auto_route("Facility", n - 1) == "topk+polish" and auto_route("Facility", n) == "greedy"
    assert f"facility location from {n:,} rows on CPU" in flat("measured.md")
    assert f"`greedy` from {n:,} rows" in SOLVERS
    # the stale claim is gone, from every page
    for name in ["README.md", *site_pages()]:
        assert "runs `topk+polish` on CPU for every built-in term" not in flat(name), name


def test_route_table_changes_when_the_table_changes(monkeypatch):
    """A different table renders a different README table (so the test above can fail)."""
    before = routes.routes_markdown()
    t = json.loads(json.dumps(solver_table.load()))
    t["rules"]["cpu"]["DiSF"] = [{"max_n": 10**12, "solver": "sgreedy+polish", "why": "x", "lamb": 0.5}]
    monkeypatch.setattr(solver_table, "load", lambda: t)
    after = routes.routes_markdown()
    assert after != before and after not in SOLVERS
    assert "| DiSF | 5,000 | `sgreedy+polish` |" in after


def test_readme_opening_says_what_the_default_runs():
    """Issue 20 item 13: the opening no longer says the chain is mask learning on the GPU; it
    names the routes `auto` takes, and they are the routes route_for takes."""
    for opening in (" ".join(page("README.md").split("## Two commands", 1)[0].split()),
                    " ".join(page("index.md").split("## Where to read on", 1)[0].split())):
        assert "mask learning on the GPU" not in opening
        assert "it learns no mask" in opening
        assert auto_route("DiSF", 20_000) == "topk+polish" and "`topk+polish`" in opening
        assert auto_route("Facility", 100_000) == "greedy"
        assert "greedy for facility location on the sparse similarity" in opening
