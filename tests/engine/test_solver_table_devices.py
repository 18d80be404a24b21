"""``auto``'s table is keyed by device and λ (issue 20 item 10): a bench run merges the rules
of its own device and keeps the others; ``choose`` reads the device's rules, falls back to the
CPU rules (saying so) where the device was not measured, and uses the nearest measured λ."""

import copy
import json
from pathlib import Path

from datamask_pipeline.engine import solver_table
from datamask_pipeline.engine.config import LearnerConfig
from datamask_pipeline.engine.select import route_for

REPO = Path(__file__).resolve().parents[2]


def _row(max_n, solver, lamb=0.5, why="measured"):
    return {"max_n": max_n, "solver": solver, "why": why, "lamb": lamb}


def test_committed_table_is_keyed_by_device_with_its_source():
    t = solver_table.load()
    assert set(t["rules"]["cpu"]) >= {"DiSF", "Facility", "Pair_simi"}
    assert set(t["sources"]) == set(t["rules"])
    for dev, src in t["sources"].items():
        assert (REPO / src["results"]).exists() and "bench.solvers" in src["command"], dev
    for rows in t["rules"]["cpu"].values():
        assert all(r["lamb"] == 0.5 for r in rows)  # the bench's λ for every committed cell


def test_merge_adds_a_device_without_touching_the_others():
    old = solver_table.load()
    before = copy.deepcopy(old)
    new = solver_table.merge(old, "cuda", {"DiSF": [_row(10**12, "paper+polish")]},
                             {"command": "gpu run", "results": "r.json"})
    assert old == before  # not mutated
    assert new["rules"]["cpu"] == before["rules"]["cpu"]
    assert new["sources"]["cpu"] == before["sources"]["cpu"]
    assert new["rules"]["cuda"] == {"DiSF": [_row(10**12, "paper+polish")]}
    assert new["sources"]["cuda"]["command"] == "gpu run"


def test_merge_replaces_only_the_terms_and_lambdas_measured():
    t = {"rules": {"cpu": {"DiSF": [_row(100, "greedy", 0.0), _row(10**12, "topk+polish", 0.5)],
                           "Pair_simi": [_row(10**12, "topk+polish", 0.5)]}}}
    new = solver_table.merge(t, "cpu", {"DiSF": [_row(10**12, "sgreedy+polish", 0.0)]}, {})
    assert new["rules"]["cpu"]["DiSF"] == [_row(10**12, "sgreedy+polish", 0.0),
                                           _row(10**12, "topk+polish", 0.5)]
    assert new["rules"]["cpu"]["Pair_simi"] == t["rules"]["cpu"]["Pair_simi"]


def test_an_unmeasured_device_uses_the_cpu_rules_and_says_so():
    t = solver_table.load()
    assert "cuda" not in t["rules"], "the README says CUDA falls back to the CPU table"
    cpu = solver_table.choose({"DiSF": 1.0}, 20_000, "cpu", lamb=0.5)
    cuda = solver_table.choose({"DiSF": 1.0}, 20_000, "cuda", lamb=0.5)
    assert cuda[0] == cpu[0]
    assert "not measured on cuda" in cuda[1] and "CPU table" in cuda[1]
    assert "not measured on" not in cpu[1]
    from tests.doc_pages import flat

    assert ("`auto` falls back to the CPU table on CUDA until `bench.solvers` is run there"
            in flat("measured.md"))


def test_a_measured_device_uses_its_own_rules():
    t = solver_table.merge(solver_table.load(), "cuda",
                           {"DiSF": [_row(10_000, "paper+polish"), _row(10**12, "sgreedy+polish")]},
                           {"command": "x", "results": "y"})
    assert solver_table.choose({"DiSF": 1.0}, 5_000, "cuda", 0.5, table=t)[0] == "paper+polish"
    solver, why = solver_table.choose({"DiSF": 1.0}, 50_000, "cuda", 0.5, table=t)
    assert solver == "sgreedy+polish" and "not measured" not in why
    # a term the GPU run did not measure: the CPU rules, said so
    solver, why = solver_table.choose({"Pair_simi": 1.0}, 5_000, "cuda", 0.5, table=t)
    assert solver == solver_table.choose({"Pair_simi": 1.0}, 5_000, "cpu", 0.5)[0]
    assert "not measured on cuda" in why


def test_lambda_specific_rules_are_used_where_they_exist():
    t = {"rules": {"cpu": {"DiSF": [_row(10**12, "greedy", 0.0), _row(10**12, "topk+polish", 0.5)]}}}
    assert solver_table.choose({"DiSF": 1}, 10**5, "cpu", 0.0, table=t) == (
        "greedy", "auto: greedy for DiSF at n=100000 (measured)")
    assert solver_table.choose({"DiSF": 1}, 10**5, "cpu", 0.5, table=t)[0] == "topk+polish"
    solver, why = solver_table.choose({"DiSF": 1}, 10**5, "cpu", 0.4, table=t)
    assert solver == "topk+polish" and "measured at λ=0.5, not at λ=0.4" in why
    solver, why = solver_table.choose({"DiSF": 1}, 10**5, "cpu", 0.1, table=t)
    assert solver == "greedy" and "measured at λ=0, not at λ=0.1" in why


def test_route_for_passes_lambda_to_the_table(monkeypatch):
    t = {"rules": {"cpu": {"Pair_simi": [_row(10**12, "sgreedy+polish", 0.0),
                                         _row(10**12, "topk+polish", 0.5)]}}}
    monkeypatch.setattr(solver_table, "load", lambda: t)
    cfg = LearnerConfig(algorithm="Pair_simi", solver="auto")
    assert route_for(cfg.replace(lamb=0.0), 1000)[0] == "sgreedy+polish"
    assert route_for(cfg.replace(lamb=0.5), 1000)[0] == "topk+polish"
