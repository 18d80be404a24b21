"""The corpus stage's Dagster-free plumbing (``engine.corpus.shards``, ``.duplicates``,
``.outputs``, ``.executor.pick_engine``) and the data root's layout: the ``data_root``
resource is a ``DataLayout`` and names every file where the plain layout does."""

import numpy as np
import pyarrow as pa
import pytest

from datamask_pipeline.engine import storage
from datamask_pipeline.engine.config import ConfigError
from datamask_pipeline.engine.corpus.duplicates import (DUPLICATES, DUPLICATES_SCHEMA,
                                                         dedup_keep, keep_mask,
                                                         write_duplicates)
from datamask_pipeline.engine.corpus.executor import pick_engine
from datamask_pipeline.engine.corpus.outputs import (SelectionFiles, last_selection,
                                                      read_selection, selection_files,
                                                      source_shares, write_selection,
                                                      write_subsets)
from datamask_pipeline.engine.corpus.select import CorpusShard
from datamask_pipeline.engine.storage import DataLayout


def test_the_resource_is_the_layout(tmp_path):
    from resources.storage import DataRoot

    root, raw = str(tmp_path / "data"), str(tmp_path / "elsewhere")
    for kw in ({}, {"raw": raw}):
        plain, resource = DataLayout(root, **kw), DataRoot(root=root, **kw)
        assert isinstance(resource, DataLayout)
        for name in ("raw_shard", "features", "rejects", "mask", "selected", "corpus_selected",
                     "report_dir", "checkpoint"):
            assert getattr(plain, name)("s_1") == getattr(resource, name)("s_1"), name
        for name in ("raw_root", "selected_root", "corpus_selected_root"):
            assert getattr(plain, name) == getattr(resource, name), name
        for name in ("corpus_dir", "catalog", "corpus_report_dir"):
            assert getattr(plain, name)() == getattr(resource, name)(), name
    with pytest.raises(ValueError, match="partition key"):
        DataLayout(root).features("../x")


def _shard(key, n):
    return CorpusShard(key=key, n=n, load=None, version=f"v-{key}")


def test_dedup_keep_reads_the_masks_back_and_refuses_stale_keeps(tmp_path):
    layout = DataLayout(str(tmp_path))
    shards = [_shard("a", 5), _shard("b", 3)]
    with pytest.raises(ConfigError, match="materialize corpus_dedup first"):
        dedup_keep(layout, shards)
    res = type("R", (), {"dropped": [dict(shard=0, row=2, dup_of_shard=1, dup_of_row=0,
                                          kept_shard=1, kept_row=0, reason="exact",
                                          kind="exact", cosine=1.0, containment=1.0)],
                         "stats": {"rows": 8, "dropped": 1}})()
    knobs = {"enabled": True, "threshold": 0.99}
    table, facts, uri = write_duplicates(layout, shards, {}, knobs, "local", res,
                                         [["a0", "a1", "a2", "a3", "a4"], ["b0", "b1", "b2"]])
    assert table.schema == DUPLICATES_SCHEMA and uri == layout.corpus_file(DUPLICATES)
    assert table.to_pylist()[0]["id"] == "a2" and table.to_pylist()[0]["dup_of_id"] == "b0"
    assert facts["versions"] == {"a": "v-a", "b": "v-b"} and facts["config"] == knobs
    kept, _ = dedup_keep(layout, [_shard("a", 5), _shard("b", 3)])
    assert kept[0].n_kept == 4 and kept[0].keep().tolist() == [True, True, False, True, True]
    assert kept[1].keep is None
    assert keep_mask(uri, "b", 3).all()
    with pytest.raises(ConfigError, match="materialize corpus_dedup again"):
        dedup_keep(layout, [_shard("a", 5)])  # shard b, which the dedup saw, is gone
    again = dedup_keep(layout, [_shard("a", 5)], recompute=lambda stale, gone: {"gone": gone})
    assert again[1] == {"gone": ["b"]}


def _publish(layout, rows_by_key: dict, shards: list) -> tuple:
    """Each shard's rows written by a SelectionFiles sink and published by write_selection
    (the corpus_selection asset's two steps); returns (the sink, the facts' uri)."""
    from datamask_pipeline.engine.corpus.budget import CorpusBudget
    from datamask_pipeline.engine.corpus.select import CorpusSelection

    sink = SelectionFiles.new(layout)
    files = {k: sink.write(k, rows) for k, rows in rows_by_key.items()}
    result = CorpusSelection(mode="gather", requested_mode="auto", budget=CorpusBudget("rows", 3),
                             term="Pair_simi", lamb=0.5, n=7, k=3, selected=None, route="test",
                             scores=None, scored_by=None, files=files)
    return sink, write_selection(layout, result, sink, shards, {}, {}, "h")


def _two_shards(tmp_path):
    layout = DataLayout(str(tmp_path))
    for key, n in (("a", 4), ("b", 3)):
        storage.makedirs(layout.raw_root)
        storage.makedirs(str(tmp_path / "features"))
        storage.atomic_write_table(pa.table({"id": np.arange(n) + 10, "source": ["w"] * n}),
                                   layout.raw_shard(key))
        storage.atomic_write_table(pa.table({"id": np.arange(n) + 10}), layout.features(key))
    return layout


def test_each_shard_writes_its_selection_and_the_facts_publish_one_version(tmp_path):
    layout = _two_shards(tmp_path)
    assert read_selection(layout) is None and selection_files(layout) == {}
    shards = [_shard("a", 4), _shard("b", 3)]
    sink, facts_uri = _publish(layout, {"a": np.array([2, 0]), "b": np.array([1])}, shards)
    assert facts_uri == layout.corpus_file("selection.json")
    files = selection_files(layout)
    assert files == {"a": sink.uri("a"), "b": sink.uri("b")}
    assert storage.read_table(files["a"]).to_pylist() == [
        {"partition_key": "a", "raw_uri": layout.raw_shard("a"), "row": r, "id": str(10 + r)}
        for r in (0, 2)]
    table, facts = read_selection(layout)
    assert table.num_rows == 3 and facts["files"]["version"] == sink.version
    assert facts["files"]["shards"]["b"]["rows"] == 1
    # a warm start reads each unchanged shard's file in its own task: here only the uris
    budget = type("B", (), {"kind": "rows", "value": 3})()
    assert last_selection(layout, shards, "h", budget) == files
    assert last_selection(layout, shards, "other knobs", budget) is None
    # the next version replaces this one whole: its files, then the facts, then the old folder
    new, _ = _publish(layout, {"a": np.array([3]), "b": np.array([0, 2])}, shards)
    assert storage.list_dirs(layout.corpus_selection_dir()) == [new.dir]
    assert read_selection(layout)[0].column("row").to_pylist() == [3, 0, 2]
    # a selection whose files were not all written is refused, the published one stays
    from datamask_pipeline.engine.corpus.select import CorpusSelection

    partial = CorpusSelection(mode="gather", requested_mode="auto", budget=None, term="x",
                              lamb=0.5, n=7, k=1, selected=None, route="t", scores=None,
                              scored_by=None, files={"a": {"rows": 1, "digest": "0"}})
    with pytest.raises(ValueError, match="not written for every shard"):
        write_selection(layout, partial, SelectionFiles.new(layout), shards, {}, {}, "h")
    assert selection_files(layout) == {"a": new.uri("a"), "b": new.uri("b")}


def test_write_subsets_rewrites_only_changed_shards_and_removes_gone_ones(tmp_path):
    layout = _two_shards(tmp_path)
    _publish(layout, {"a": np.array([0, 2]), "b": np.array([1])}, [_shard("a", 4), _shard("b", 3)])
    done = write_subsets(layout, "id")
    assert done.rewritten == ["a", "b"] and done.rows_written == 3 and done.removed == []
    assert storage.read_table(layout.corpus_selected("a")).column("id").to_pylist() == [10, 12]
    assert source_shares(layout, ["a", "b"]) == {"w": (7, 3)}
    _publish(layout, {"a": np.array([0, 2])}, [_shard("a", 4)])
    again = write_subsets(layout, "id")
    assert again.rewritten == [] and again.removed == ["b"]


def test_pick_engine():
    shards = [_shard("a", 10)]
    assert pick_engine(" Local ", shards, "exchange", 5) == "local"
    assert pick_engine("auto", shards, "gather", 5) == "local"  # gather never uses Ray
    assert pick_engine("auto", shards, "exchange", 100) == "local"  # small corpus
    with pytest.raises(ConfigError, match=r"engine must be one of \['auto', 'local', 'ray'\]"):
        pick_engine("spark", shards, "exchange", 5)
