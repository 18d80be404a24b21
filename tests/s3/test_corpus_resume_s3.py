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
