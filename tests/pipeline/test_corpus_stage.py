"""The corpus stage through dg.materialize: features and checks per shard, then one selection
over every shard that passed (corpus_selection) and each shard's selected rows
(corpus_subset): exact budget, lineage to raw file and row, a failed shard left out and said
so, unchanged shards not rewritten, a removed shard's rows gone, an interrupted subset resumed."""

import json
import os

import dagster as dg
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from assets.corpus import CorpusConfig, corpus_dedup, corpus_selection, corpus_subset
from assets.partitions import register_shards
from datamask_pipeline.engine.corpus.outputs import read_selection

from .helpers import ALL_ASSETS, KEYS, ROWS

ASSETS = ALL_ASSETS + [corpus_dedup, corpus_selection, corpus_subset]
BAD = "shard_bad"


def _features(instance, resources, key):
    return dg.materialize(ASSETS, partition_key=key, instance=instance, resources=resources,
                          selection=dg.AssetSelection.assets("features"), raise_on_error=False)


def _corpus(instance, resources, raise_on_error=True, **knobs):
    cfg = CorpusConfig(**{"algorithm": "Pair_simi", **knobs})
    return dg.materialize(ASSETS, instance=instance, resources=resources,
                          selection=dg.AssetSelection.assets("corpus_dedup", "corpus_selection",
                                                             "corpus_subset"),
                          run_config=dg.RunConfig({"corpus_selection": cfg}),
                          raise_on_error=raise_on_error)


def _meta(result, key):
    for ev in result.get_asset_materialization_events():
        if ev.asset_key.to_user_string() == key:
            return ev.materialization.metadata
    raise KeyError(key)


@pytest.fixture
def prepared(instance, corpus, data_root, resources):
    """The tiny corpus plus a shard whose quality breaks a blocking check; features run for
    every shard."""
    t = pq.read_table(data_root.raw_shard(KEYS[0]))
    q = t.column("quality_score").to_numpy().copy()
    q[3] = np.nan
    bad = t.set_column(t.schema.get_field_index("quality_score"), "quality_score", pa.array(q))
    bad = bad.set_column(0, "chunk_id", pc.add(bad.column("chunk_id"), 10_000))
    pq.write_table(bad, os.path.join(data_root.raw_root, f"{BAD}.parquet"))
    register_shards(instance, data_root.raw_root)
    for key in KEYS + [BAD]:
        r = _features(instance, resources, key)
        assert (key == BAD) != all(e.passed for e in r.get_asset_check_evaluations())
    return data_root


def _selected_ids(data_root, keys):
    out = []
    for key in keys:
        out += pq.read_table(data_root.corpus_selected(key)).column("chunk_id").to_pylist()
    return out


def test_corpus_stage_end_to_end(prepared, instance, resources):
    data_root = prepared
    result = _corpus(instance, resources, select_rows=100)
    meta = _meta(result, "corpus_selection")
    assert meta["mode"].value == "gather" and meta["rows_selected"].value == 100
    assert meta["incomplete"].value is True
    assert BAD in meta["excluded_shards"].value and "checks not passed" in meta["excluded_shards"].value[BAD]
    assert "Pair_simi" in meta["whole_corpus_scores"].value and "corpus gather" in meta["whole_corpus_scores"].value

    sel = read_selection(data_root)[0]
    assert sel.num_rows == 100 and BAD not in set(sel.column("partition_key").to_pylist())
    pairs = list(zip(sel.column("partition_key").to_pylist(), sel.column("row").to_pylist()))
    assert len(set(pairs)) == 100
    # lineage: every selected row points at its raw file and row
    for key, raw_uri, row, id_ in zip(*(sel.column(c).to_pylist() for c in sel.column_names)):
        assert raw_uri == data_root.raw_shard(key)
    raw = {k: pq.read_table(data_root.raw_shard(k)) for k in KEYS}
    for key, row, id_ in zip(sel.column("partition_key").to_pylist(), sel.column("row").to_pylist(),
                             sel.column("id").to_pylist()):
        assert str(raw[key].column("chunk_id")[row].as_py()) == id_

    # the subsets: every raw column, exactly the selected rows, no row twice
    got = _selected_ids(data_root, KEYS)
    assert sorted(map(str, got)) == sorted(sel.column("id").to_pylist())
    assert not os.path.exists(data_root.corpus_selected(BAD))
    sub = pq.read_table(data_root.corpus_selected(KEYS[0]))
    assert sub.schema.names == raw[KEYS[0]].schema.names
    smeta = _meta(result, "corpus_subset")
    assert sorted(smeta["rewritten_shards"].value) == KEYS
    assert "| web |" in smeta["source_shares"].value or "| code |" in smeta["source_shares"].value
    page = open(smeta["report"].value).read()
    assert "Each shard's share" in page and "Each source's share" in page
    assert page.count("data:image/png;base64,") == 2 and BAD in page  # the plots; the left-out shard
    summary = json.loads(open(os.path.join(data_root.corpus_dir(), "selection.json")).read())
    assert sum(summary["counts"].values()) == 100 and summary["excluded"].keys() == {BAD}

    # nothing changed: no subset is rewritten, and the dry run says nothing is due
    again = _corpus(instance, resources, select_rows=100)
    assert _meta(again, "corpus_subset")["rewritten_shards"].value == []
    from datamask_pipeline.plan import corpus_plan, render_corpus

    assert corpus_plan(instance, data_root)["due"] is False

    # a shard re-ingested: the dry run says a re-selection is due, what it launches and costs;
    # nothing launched it
    _features(instance, resources, KEYS[1])
    due = corpus_plan(instance, data_root)
    assert due["due"] and due["changed"] == [KEYS[1]] and due["estimated_seconds"] > 0
    assert due["rows"] == 3 * ROWS and "corpus_job" in render_corpus(due)
    assert len(instance.fetch_materializations(dg.AssetKey("corpus_selection"), limit=10).records) == 2

    # an interrupted subset step (one file and the manifest lost): resumed, nothing lost
    os.remove(data_root.corpus_selected(KEYS[1]))
    os.remove(os.path.join(data_root.corpus_dir(), "subsets.json"))
    dg.materialize(ASSETS, instance=instance, resources=resources,
                   selection=dg.AssetSelection.assets("corpus_subset"))
    assert sorted(map(str, _selected_ids(data_root, KEYS))) == sorted(sel.column("id").to_pylist())

    # a shard removed from the raw location: its rows leave the selection, the budget holds
    os.remove(data_root.raw_shard(KEYS[2]))
    third = _corpus(instance, resources, select_rows=100)
    sel3 = read_selection(data_root)[0]
    assert sel3.num_rows == 100 and set(sel3.column("partition_key").to_pylist()) <= set(KEYS[:2])
    assert not os.path.exists(data_root.corpus_selected(KEYS[2]))
    assert _meta(third, "corpus_subset")["removed_shards"].value == [KEYS[2]]
    assert len(_selected_ids(data_root, KEYS[:2])) == 100


def test_impossible_budget_fails_readably_and_keeps_the_last_selection(prepared, instance,
                                                                         resources):
    data_root = prepared
    _corpus(instance, resources, select_ratio=0.1)
    facts = os.path.join(data_root.corpus_dir(), "selection.json")
    before, table = open(facts, "rb").read(), read_selection(data_root)[0]
    versions = os.listdir(data_root.corpus_selection_dir())
    assert len(versions) == 1 and table.num_rows > 0
    r = _corpus(instance, resources, raise_on_error=False, select_rows=3 * ROWS + 1)
    assert not r.success
    failure = [e for e in r.all_events if e.is_step_failure][0]
    msg = failure.step_failure_data.error.message
    assert "corpus_selection" in msg and "nothing to choose" in msg
    # the published selection is as it was, and the failed run left no version behind
    assert open(facts, "rb").read() == before and read_selection(data_root)[0].equals(table)
    assert os.listdir(data_root.corpus_selection_dir()) == versions


def test_token_budget_through_the_asset(prepared, instance, resources):
    data_root = prepared
    words = sum(int(pc.sum(pc.list_value_length(pc.utf8_split_whitespace(
        pq.read_table(data_root.raw_shard(k)).column("text")))).as_py()) for k in KEYS)
    target = words // 10
    result = _corpus(instance, resources, select_tokens=target, mode="exchange")
    tokens = _meta(result, "corpus_selection")["tokens"].value
    assert tokens["target"] == target and tokens["selected"] <= target
    assert target - tokens["selected"] < tokens["largest_document"]
    assert _meta(result, "corpus_selection")["mode"].value == "exchange"


def _dup_shard(data_root, key, source_key, rows, id_offset):
    """A new raw shard whose rows repeat ``rows`` of ``source_key`` (text plus a footer,
    slightly worse quality, the same embedding): duplicates in another file."""
    t = pq.read_table(data_root.raw_shard(source_key)).take(pa.array(rows))
    t = t.set_column(0, "chunk_id", pc.add(t.column("chunk_id"), id_offset))
    t = t.set_column(t.schema.get_field_index("quality_score"), "quality_score",
                     pc.subtract(t.column("quality_score"), 0.001))
    t = t.set_column(t.schema.get_field_index("text"), "text",
                     pc.binary_join_element_wise(t.column("text"),
                                                 "Shared from our weekly newsletter.", "\n"))
    pq.write_table(t, os.path.join(data_root.raw_root, f"{key}.parquet"))


def test_duplicates_across_shards_are_dropped_with_lineage_and_a_new_shard_of_copies(
        instance, corpus, data_root, resources):
    register_shards(instance, data_root.raw_root)
    for key in KEYS:
        _features(instance, resources, key)
    first = _corpus(instance, resources, select_rows=60)
    dmeta = _meta(first, "corpus_dedup")
    assert dmeta["enabled"].value is True and dmeta["threshold"].value == 0.99
    dups = pq.read_table(os.path.join(data_root.corpus_dir(), "duplicates.parquet"))
    assert dmeta["dropped"].value == dups.num_rows > 0  # the sample's boilerplate rows
    sel = read_selection(data_root)[0]
    dropped = set(zip(dups.column("partition_key").to_pylist(), dups.column("row").to_pylist()))
    chosen = set(zip(sel.column("partition_key").to_pylist(), sel.column("row").to_pylist()))
    assert not dropped & chosen and len(chosen) == 60
    # lineage: each dropped row names a row that is kept or itself dropped for a reason
    assert set(dups.column("reason").to_pylist()) <= {"exact", "fuzzy", "near"}
    assert _meta(first, "corpus_selection")["dedup_dropped"].value == dups.num_rows
    page = open(_meta(first, "corpus_subset")["report"].value).read()
    assert "Deduplication" in page and "cosine ≥ 0.99" in page and f"{dups.num_rows:,} (" in page

    # a new shard copies 10 selected rows of shard_000: the copies are dropped as their
    # duplicates and never selected; the originals stay selected
    picked = sorted(r for k, r in chosen if k == KEYS[0])[:10]
    _dup_shard(data_root, "shard_copy", KEYS[0], picked, 50_000)
    register_shards(instance, data_root.raw_root)
    _features(instance, resources, "shard_copy")
    second = _corpus(instance, resources, select_rows=60)
    dups = pq.read_table(os.path.join(data_root.corpus_dir(), "duplicates.parquet"))
    copies = {r: (k, o) for p, r, k, o in zip(*(dups.column(c).to_pylist() for c in (
        "partition_key", "row", "dup_of_partition_key", "dup_of_row"))) if p == "shard_copy"}
    assert copies == {i: (KEYS[0], picked[i]) for i in range(10)}
    sel = read_selection(data_root)[0]
    chosen2 = set(zip(sel.column("partition_key").to_pylist(), sel.column("row").to_pylist()))
    assert not any(k == "shard_copy" for k, _ in chosen2)
    assert {(KEYS[0], r) for r in picked} <= chosen2
    assert _meta(second, "corpus_subset")["rewritten_shards"].value == ["shard_copy"]
    _check_duplicates_section(open(_meta(second, "corpus_subset")["report"].value).read(),
                              dups.to_pylist(), data_root)

    # one setting turns it off: nothing dropped, every row may be selected
    off = dg.materialize(
        ASSETS, instance=instance, resources=resources,
        selection=dg.AssetSelection.assets("corpus_dedup", "corpus_selection", "corpus_subset"),
        run_config=dg.RunConfig({"corpus_dedup": {"config": {"enabled": False}},
                                 "corpus_selection": CorpusConfig(algorithm="Pair_simi",
                                                                  select_rows=60)}))
    assert _meta(off, "corpus_dedup")["dropped"].value == 0
    assert _meta(off, "corpus_selection")["rows_after_dedup"].value == 3 * ROWS + 10


def _check_duplicates_section(page: str, dups: list, data_root):
    """The report's side-by-side sample: up to 4 dropped rows of each kind, each with its kind,
    containment and cosine as in duplicates.parquet, and both rows' raw text."""
    import html
    import re

    assert "Duplicates: a sample of dropped rows" in page
    by = {(d["partition_key"], d["row"]): d for d in dups}
    cells = re.findall(r"<tr><td>(\w+)</td><td>([^<]*)</td><td>([^<]*)</td>\s*"
                       r"<td><b>(\S+) row (\d+) \(id [^)]*\)</b><pre class=\"excerpt\">(.*?)</pre></td>"
                       r"\s*<td><b>(\S+) row (\d+) \(id [^)]*\)</b><pre class=\"excerpt\">(.*?)</pre>",
                       page, re.S)
    kinds = {}
    for d in dups:
        kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
    assert len(cells) == sum(min(4, c) for c in kinds.values()) > 0
    texts = {}
    for kind, cont, cos, key, row, text, okey, orow, otext in cells:
        d = by[(key, int(row))]
        assert kind == d["kind"] and (d["dup_of_partition_key"], d["dup_of_row"]) == (okey, int(orow))
        assert cont == f"{d['containment']:.3f}" and cos == f"{d['cosine']:.3f}"
        for k, r, shown in ((key, int(row), text), (okey, int(orow), otext)):
            if k not in texts:
                texts[k] = pq.read_table(data_root.raw_shard(k)).column("text").to_pylist()
            raw = texts[k][r]
            assert html.unescape(shown).rstrip(" …") == raw[:400].rstrip() or \
                html.unescape(shown) == raw


def test_a_corpus_of_duplicates_fails_readably(instance, data_root, resources):
    from datamask_pipeline.engine.sample import make_table

    os.makedirs(data_root.raw_root, exist_ok=True)
    t = make_table(50, dim=16, seed=1)
    for i in range(2):  # the same 50 rows twice, under other ids
        u = t.set_column(0, "chunk_id", pc.add(t.column("chunk_id"), i * 1000))
        pq.write_table(u, os.path.join(data_root.raw_root, f"dup_{i}.parquet"))
    register_shards(instance, data_root.raw_root)
    for key in ("dup_0", "dup_1"):
        _features(instance, resources, key)
    r = _corpus(instance, resources, raise_on_error=False, select_ratio=0.6)
    assert not r.success
    msg = [e for e in r.all_events if e.is_step_failure][0].step_failure_data.error.message
    assert "remain after deduplication" in msg and "60" in msg


def test_exchange_takes_a_new_shard_from_the_last_selection(instance, corpus, data_root,
                                                            resources):
    register_shards(instance, data_root.raw_root)
    for key in KEYS:
        _features(instance, resources, key)
    first = _corpus(instance, resources, select_ratio=0.1, mode="exchange")
    assert "warm start" not in _meta(first, "corpus_selection")["route"].value
    # a new shard arrives: the next selection starts from the last one (no shard selected
    # again), the new shard's rows enter through the gains, the budget holds
    from datamask_pipeline.engine.sample import make_table

    pq.write_table(make_table(ROWS, dim=16, seed=3, id_offset=90_000, row_seed=9),
                   os.path.join(data_root.raw_root, "shard_new.parquet"))
    register_shards(instance, data_root.raw_root)
    _features(instance, resources, "shard_new")
    second = _corpus(instance, resources, select_ratio=0.1, mode="exchange")
    meta = _meta(second, "corpus_selection")
    assert "warm start" in meta["route"].value
    assert meta["rows_selected"].value == round(0.1 * 4 * ROWS)
    # knobs changed: no warm start
    third = _corpus(instance, resources, select_ratio=0.1, mode="exchange", lamb=0.3)
    assert "warm start" not in _meta(third, "corpus_selection")["route"].value


def test_a_missing_token_column_fails_readably_and_writes_nothing(prepared, instance, resources):
    data_root = prepared
    r = _corpus(instance, resources, raise_on_error=False, select_tokens=1000,
                token_column="n_tokens")
    assert not r.success
    msg = [e for e in r.all_events if e.is_step_failure][0].step_failure_data.error.message
    assert "column 'n_tokens'" in msg and "rule 'column present'" in msg and "shard_000" in msg
    assert read_selection(data_root) is None


def test_removing_the_keepers_shard_frees_its_duplicates(instance, corpus, data_root, resources):
    """The dedup's keep decisions hold only over the shards it saw: once the shard of the kept
    rows is gone, their copies in another shard are no longer duplicates of anything present.
    corpus_selection run alone deduplicates again over the shards present (it used to select
    with the stale keeps and report success); corpus_job gives the same."""
    register_shards(instance, data_root.raw_root)
    for key in KEYS:
        _features(instance, resources, key)
    picked = list(range(10))
    _dup_shard(data_root, "shard_copy", KEYS[0], picked, 50_000)
    register_shards(instance, data_root.raw_root)
    _features(instance, resources, "shard_copy")
    _corpus(instance, resources, select_rows=60)
    dup_uri = os.path.join(data_root.corpus_dir(), "duplicates.parquet")
    dups = pq.read_table(dup_uri).to_pylist()
    copies = {d["row"]: d for d in dups if d["partition_key"] == "shard_copy"}
    assert sorted(copies) == picked
    # the copies whose kept row is in shard_000 (the others' originals are duplicates of rows
    # of other shards, which stay)
    freed = [r for r, d in copies.items() if d["kept_partition_key"] == KEYS[0]]
    assert len(freed) >= 5

    os.remove(data_root.raw_shard(KEYS[0]))  # the keeper's shard leaves the corpus
    alone = dg.materialize(ASSETS, instance=instance, resources=resources,
                           selection=dg.AssetSelection.assets("corpus_selection"),
                           run_config=dg.RunConfig({"corpus_selection": CorpusConfig(
                               algorithm="Pair_simi", select_rows=60)}))
    dups = pq.read_table(dup_uri).to_pylist()
    assert not [d for d in dups if d["partition_key"] == "shard_copy" and d["row"] in freed]
    assert not [d for d in dups if KEYS[0] in (d["partition_key"], d["kept_partition_key"],
                                               d["dup_of_partition_key"])]
    facts = json.load(open(os.path.join(data_root.corpus_dir(), "selection.json")))
    assert KEYS[0] not in facts["sizes"]
    md = _meta(alone, "corpus_selection")
    assert md["rows_after_dedup"].value == md["rows_corpus"].value - len(dups)
    dedup = json.load(open(os.path.join(data_root.corpus_dir(), "dedup.json")))
    assert dedup["recomputed_by"] == "corpus_selection" and KEYS[0] not in dedup["versions"]

    again = _corpus(instance, resources, select_rows=60)  # corpus_job: the same keeps
    assert pq.read_table(dup_uri).to_pylist() == dups
    assert _meta(again, "corpus_selection")["rows_after_dedup"].value == \
        md["rows_after_dedup"].value
