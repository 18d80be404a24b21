"""Scores are named by the route that produced them wherever a user sees one (issue 20 item
13): the catalog's columns, the corpus summary's table, the mask's scores table and the
demo's per-shard summary; "DATAMASK" only where the policy-gradient learner ran."""

import duckdb

from assets.learn import scores_markdown
from assets.report import SHARD_COLUMNS, summary_metadata
from datamask_pipeline.demo import _print_summary

SCORES = {"datamask": {"f": 0.5, "f_qua": 0.6, "f_div": 0.4},
          "quality_topk": {"f": 0.45, "f_qua": 0.7, "f_div": 0.2},
          "random": {"f": 0.3, "f_qua": 0.3, "f_div": 0.3}}


def _row(key, route, guard=None):
    row = {c: None for c, _ in SHARD_COLUMNS}
    row.update(partition_key=key, rows_raw=100, rows_selected=10, kept_fraction=0.1,
               quality_mean_before=0.5, quality_mean_after=0.7, solver="auto", route=route,
               guard=guard, f_selection=0.5, f_quality_topk=0.45, f_random=0.3,
               selected_uri=f"/data/selected/{key}.parquet")
    return row


def test_catalog_columns_name_the_selection_and_its_route():
    names = [c for c, _ in SHARD_COLUMNS]
    assert not [c for c in names if "datamask" in c]
    assert {"solver", "route", "guard", "f_selection", "f_qua_selection", "f_div_selection"} <= set(names)


def test_corpus_summary_table_names_each_shards_route():
    md = summary_metadata([_row("a", "topk+polish"), _row("b", "paper+polish"),
                           _row("c", "topk+polish", "quality_topk scored f=1 ...: returned quality_topk")],
                          ["a", "b", "c"], [])["per_shard"].value
    assert "| shard | route |" in md and "f selection" in md and "f DATAMASK" not in md
    assert "| a | topk+polish |" in md
    assert "| b | DATAMASK (paper+polish) |" in md
    assert "| c | topk+polish → quality top-k (guard) |" in md


def test_mask_scores_table_names_the_route():
    md = scores_markdown(SCORES, "DiSF", 0.5, "greedy")
    assert "| greedy | 0.5 |" in md and "datamask" not in md.lower()
    assert "| DATAMASK (paper) | 0.5 |" in scores_markdown(SCORES, "DiSF", 0.5, "paper")


def test_demo_summary_prints_the_renamed_columns_and_the_route(tmp_path, capsys):
    con = duckdb.connect(str(tmp_path / "catalog.duckdb"))
    con.execute("CREATE TABLE shards (" + ", ".join(f"{c} {t}" for c, t in SHARD_COLUMNS) + ")")
    for r in (_row("shard_000", "topk+polish"), _row("shard_001", "greedy")):
        con.execute(f"INSERT INTO shards VALUES ({', '.join('?' for _ in SHARD_COLUMNS)})",
                    [r[c] for c, _ in SHARD_COLUMNS])
    con.close()
    _print_summary(str(tmp_path), ["shard_000", "shard_001"], {"shard_000": 1.0, "shard_001": 2.0})
    out = capsys.readouterr().out
    table = out.split("Shard reports:", 1)[1]
    assert "f selection" in table and "route" in table and "DATAMASK" not in table
    lines = {line.split()[0]: line for line in table.splitlines() if line.startswith("shard_")}
    assert lines["shard_000"].rstrip().endswith("topk+polish")
    assert lines["shard_001"].rstrip().endswith("greedy")
