"""A corpus run killed on object storage resumes from its last round there: the run's state
(each shard's selected rows by version, the coordinator's round) lives on the data root's
storage, moto's S3 server here, and the resumed run selects exactly what an unbroken run does."""

import numpy as np
import pyarrow.fs as pafs
import pytest

from bench.corpus import make_cuts
from datamask_pipeline.engine.config import LearnerConfig
from datamask_pipeline.engine.corpus import CorpusBudget, CorpusShard, Part, select_corpus
from datamask_pipeline.engine.data import table_to_shard
from datamask_pipeline.engine.sample import make_table


class Killed(Exception):
    pass


def _shards(x, q, ids, files, reads):
    def load(r):
        reads.append(1)
        return Part(x[r], q[r], ids[r])

    return [CorpusShard(key=f"f{i:02d}", n=len(r), load=lambda r=r: load(r))
            for i, r in enumerate(files)]


def test_a_corpus_run_killed_on_s3_resumes_from_its_last_round(bucket, s3fs):
    t = make_table(2000, dim=32, seed=3)
    sh = table_to_shard(t, "corpus")
    x, q, ids = sh.embeddings, sh.quality, sh.ids
    files = make_cuts(q, np.asarray(t.column("source").to_pylist()), 4)["sorted_by_quality"]
    cfg = LearnerConfig.profile("pipeline", algorithm="Pair_simi", lamb=0.7)
    budget = CorpusBudget.of(select_rows=200)
    clean = select_corpus(_shards(x, q, ids, files, []), cfg, budget, mode="exchange",
                          gather_max_rows=0)
    assert len(clean.rounds) >= 3

    def kill(info):
        if info["round"] == 2:
            raise Killed

    root = f"s3://{bucket}/checkpoints/corpus"
    with pytest.raises(Killed):
        select_corpus(_shards(x, q, ids, files, []), cfg, budget, mode="exchange",
                      gather_max_rows=0, checkpoint_dir=root, on_round=kill)
    left = s3fs.get_file_info(pafs.FileSelector(f"{bucket}/checkpoints", recursive=True))
    assert any(i.path.endswith("round.npz") for i in left)  # the state is on the bucket

    log, reads = [], []
    resumed = select_corpus(_shards(x, q, ids, files, reads), cfg, budget, mode="exchange",
                            gather_max_rows=0, checkpoint_dir=root, log=log.append)
    assert any("from the checkpoint of an earlier attempt" in m for m in log)
    assert any("resuming the exchange after round 2" in m for m in log)
    assert all(np.array_equal(resumed.selected[k], clean.selected[k]) for k in clean.selected)
    assert [r["round"] for r in resumed.rounds] == [r["round"] for r in clean.rounds]
    assert resumed.scores["selection"]["f"] == pytest.approx(clean.scores["selection"]["f"])
    # rounds 1-2 are not run again: the first shard's head, each shard's start statistics,
    # each remaining round, and the three scoring passes (histogram, its bin, the score)
    assert len(reads) == 1 + 4 * (1 + (len(clean.rounds) - 2) + 3)
    left = s3fs.get_file_info(pafs.FileSelector(f"{bucket}/checkpoints", recursive=True,
                                                allow_not_found=True))
    assert not [i for i in left if i.type == pafs.FileType.File]  # removed once finished


def test_the_selection_is_published_and_replaced_on_s3(bucket, s3fs):
    """The per-shard selection files and the facts that publish them, on object storage: a
    new version replaces the old one whole (its prefix removed after the facts are written),
    and the subsets are written from the published files."""
    import pyarrow as pa

    from datamask_pipeline.engine import storage
    from datamask_pipeline.engine.corpus.outputs import (SelectionFiles, read_selection,
                                                          selection_files, write_selection,
                                                          write_subsets)
    from datamask_pipeline.engine.corpus.select import CorpusSelection

    layout = storage.DataLayout(f"s3://{bucket}/data")
    for key, n in (("a", 4), ("b", 3)):
        storage.atomic_write_table(pa.table({"chunk_id": np.arange(n) + 10}),
                                   layout.raw_shard(key))
        storage.atomic_write_table(pa.table({"id": np.arange(n) + 10}), layout.features(key))
    shards = [CorpusShard(key="a", n=4, load=None), CorpusShard(key="b", n=3, load=None)]

    def publish(rows):
        sink = SelectionFiles.new(layout)
        files = {k: sink.write(k, r) for k, r in rows.items()}
        res = CorpusSelection(mode="gather", requested_mode="auto", budget=budget, term="x",
                              lamb=0.5, n=7, k=3, selected=None, route="t", scores=None,
                              scored_by=None, files=files)
        write_selection(layout, res, sink, shards, {}, {}, "h")
        return sink

    budget = CorpusBudget.of(select_rows=3)
    first = publish({"a": np.array([0, 2]), "b": np.array([1])})
    second = publish({"a": np.array([3]), "b": np.array([0, 2])})
    assert storage.list_dirs(layout.corpus_selection_dir()) == [second.dir]
    assert not storage.exists(first.uri("a"))
    assert selection_files(layout) == {"a": second.uri("a"), "b": second.uri("b")}
    assert read_selection(layout)[0].column("id").to_pylist() == ["13", "10", "12"]
    done = write_subsets(layout, "chunk_id")
    assert done.rows_written == 3
    assert storage.read_table(layout.corpus_selected("b")).column("chunk_id").to_pylist() == [10, 12]
