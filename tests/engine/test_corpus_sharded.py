"""The corpus stage past one process: per_shard and exchange as one task per shard
(engine/corpus/sharded.py) on Ray tasks give the same selection as in this process, with every
shard read in a worker and never in the coordinator; the coordinator's state (quality top-k
threshold, statistics) reproduces what the whole corpus's arrays give."""

import dataclasses
import functools
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.corpus import make_cuts
from datamask_pipeline.engine.config import LearnerConfig
from datamask_pipeline.engine.corpus import CorpusBudget, CorpusShard, select_corpus
from datamask_pipeline.engine import storage
from datamask_pipeline.engine.corpus.executor import InProcess, RayTasks, executor_for
from datamask_pipeline.engine.corpus.outputs import SelectionFiles
from datamask_pipeline.engine.corpus.stats import stats_for
from datamask_pipeline.engine.data import read_shard, table_to_shard
from datamask_pipeline.engine.sample import make_table
from datamask_pipeline.engine.storage import DataLayout

ray = pytest.importorskip("ray", reason="the ray extra is part of the test extra")


def load_logged(uri: str, log_dir: str):
    """A shard's features, read where the task runs; the reading process leaves its pid."""
    with open(os.path.join(log_dir, f"{os.getpid()}-{os.path.basename(uri)}"), "a") as fh:
        fh.write("1\n")
    return read_shard(uri)


def _files(tmp_path, n=1800, dim=16, files=4, cut="sorted_by_quality"):
    t = make_table(n, dim=dim, seed=5)
    sh = table_to_shard(t, "corpus")
    rows = make_cuts(sh.quality, np.asarray(t.column("source").to_pylist()), files)[cut]
    uris = []
    for i, r in enumerate(rows):
        uri = str(tmp_path / f"f{i:02d}.parquet")
        pq.write_table(t.take(np.sort(r)), uri)
        uris.append(uri)
    return uris


def _shards(uris, log_dir, keep=None):
    out = []
    for i, u in enumerate(uris):
        n = pq.ParquetFile(u).metadata.num_rows
        out.append(CorpusShard(key=f"f{i:02d}", n=n,
                               load=functools.partial(load_logged, u, str(log_dir)),
                               keep=None if keep is None else keep[i]))
    return out


@pytest.fixture(scope="module")
def ray_two_cpus():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.mark.parametrize("term,mode", [("Pair_simi", "exchange"), ("DiSF", "exchange"),
                                       ("Facility", "exchange"), ("Facility", "per_shard")])
def test_ray_tasks_select_what_one_process_selects_and_the_coordinator_reads_no_shard(
        tmp_path, ray_two_cpus, term, mode):
    uris = _files(tmp_path)
    cfg = LearnerConfig.profile("pipeline", algorithm=term, lamb=0.7)
    budget = CorpusBudget.of(select_rows=180)
    rng = np.random.default_rng(0)
    keep = [rng.random(pq.ParquetFile(u).metadata.num_rows) > 0.1 for u in uris]
    local_log, ray_log = tmp_path / "local", tmp_path / "ray"
    local_log.mkdir()
    ray_log.mkdir()
    here = select_corpus(_shards(uris, local_log, keep), cfg, budget, mode=mode,
                         gather_max_rows=0, executor=InProcess())
    there = select_corpus(_shards(uris, ray_log, keep), cfg, budget, mode=mode,
                          gather_max_rows=0, executor=RayTasks())
    assert there.counts == here.counts and sum(there.counts.values()) == 180
    for key in here.selected:
        assert np.array_equal(there.selected[key], here.selected[key]), key
        assert keep[int(key[1:])][there.selected[key]].all()  # no dropped row selected
    assert there.rounds == [] or [r["swaps"] for r in there.rounds] == \
        [r["swaps"] for r in here.rounds]
    assert there.scores == here.scores
    # every shard was read, each time in a Ray worker, never in this (the coordinator's) process
    pids = {name.split("-", 1)[0] for name in os.listdir(ray_log)}
    assert pids and str(os.getpid()) not in pids
    assert {name.split("-", 1)[1] for name in os.listdir(ray_log)} == \
        {os.path.basename(u) for u in uris}


@dataclasses.dataclass(frozen=True)
class LoggedFiles(SelectionFiles):
    """The product's sink; each write leaves the writing process's pid."""

    log_dir: str = ""

    def write(self, key, rows):
        with open(os.path.join(self.log_dir, f"{os.getpid()}-{key}"), "a") as fh:
            fh.write("1\n")
        return super().write(key, rows)


@pytest.mark.parametrize("term,mode", [("DiSF", "exchange"), ("Facility", "per_shard"),
                                       ("Facility", "exchange")])
def test_the_selected_rows_are_written_by_the_shards_tasks_and_never_reach_the_coordinator(
        tmp_path, ray_two_cpus, term, mode):
    """Item 2 of issue 24: past one selection, each shard's last task writes its selected rows
    (corpus/selection/<version>/<key>.parquet); the coordinator gets their counts only."""
    uris = _files(tmp_path)
    layout = DataLayout(str(tmp_path / "data"))
    storage.makedirs(str(tmp_path / "data" / "features"))
    for i, u in enumerate(uris):  # the features' id column: what the sink reads
        pq.write_table(pa.table({"id": read_shard(u).ids}), layout.features(f"f{i:02d}"))
    cfg = LearnerConfig.profile("pipeline", algorithm=term, lamb=0.7)
    budget = CorpusBudget.of(select_rows=180)
    here = select_corpus(_shards(uris, tmp_path), cfg, budget, mode=mode, gather_max_rows=0)
    writes = tmp_path / "writes"
    writes.mkdir()
    base = SelectionFiles.new(layout)
    sink = LoggedFiles(base.root, base.raw, base.version, log_dir=str(writes))
    there = select_corpus(_shards(uris, tmp_path), cfg, budget, mode=mode, gather_max_rows=0,
                          executor=RayTasks(), sink=sink)
    assert there.selected is None and there.counts == here.counts and there.k == 180
    for key, rows in here.selected.items():
        t = storage.read_table(sink.uri(key))
        assert t.column("row").to_pylist() == rows.tolist(), key
        ids = read_shard(uris[int(key[1:])]).ids[rows]
        assert t.column("id").to_pylist() == [str(i) for i in ids]
        assert there.files[key]["rows"] == rows.size
    pids = {name.split("-", 1)[0] for name in os.listdir(writes)}
    assert pids and str(os.getpid()) not in pids
    assert sorted(name.split("-", 1)[1] for name in os.listdir(writes)) == sorted(here.selected)


def test_the_quality_topk_threshold_is_the_whole_corpus_topk(tmp_path):
    """Ties at the threshold (a saturated score) go to the first rows in shard order, as the
    whole corpus's top-k over its arrays."""
    uris = _files(tmp_path, n=1200, files=3, cut="random_blocks")
    shards = _shards(uris, tmp_path)
    parts = [s.load() for s in shards]
    q_all = np.concatenate([np.round(p.quality, 1) for p in parts])  # heavy ties
    cfg = LearnerConfig.profile("pipeline", algorithm="Pair_simi", lamb=0.5)

    def rounded(u):
        p = read_shard(u)
        p.quality = np.round(p.quality, 1)
        return p

    tied = [CorpusShard(key=s.key, n=s.n, load=functools.partial(rounded, u))
            for s, u in zip(shards, uris)]
    res = select_corpus(tied, cfg, CorpusBudget.of(select_rows=137), mode="per_shard",
                        gather_max_rows=0)
    order = np.lexsort((np.arange(q_all.size), -q_all))[:137]
    x_all = np.concatenate([p.embeddings for p in parts])
    st = stats_for("Pair_simi", 0.5, x_all.shape[1])
    want = st.f(st.add(st.zero(), st.rows(x_all[np.sort(order)]), q_all[np.sort(order)]), 137)
    assert res.scores["quality_topk"] == pytest.approx(want, rel=1e-9)


def test_executor_for_names_what_runs():
    assert isinstance(executor_for("local"), InProcess)
    with pytest.raises(ValueError, match="corpus engine must be one of"):
        executor_for("spark")


@pytest.fixture(scope="module")
def overlapping(tmp_path_factory):
    """10,000 low-d rows around 64 overlapping centres in 20 files sorted by quality: k-means
    blocks of this corpus cut across its neighbourhoods (bench.corpus_ray's generator)."""
    from bench.corpus_ray import generate, load_npy

    bases = generate(str(tmp_path_factory.mktemp("overlap")), 10_000, 20, 16,
                     cut="sorted_by_quality")
    shards = [CorpusShard(key=f"s{i:02d}", n=500, load=functools.partial(load_npy, b, i * 500))
              for i, b in enumerate(bases)]
    x = np.concatenate([np.load(b + ".x.npy").astype(np.float32) for b in bases])
    q = np.concatenate([np.load(b + ".q.npy").astype(np.float64) for b in bases])
    return shards, x, q


def _union_rows(res, shards):
    return np.concatenate([np.asarray(res.selected[s.key]) + i * s.n
                           for i, s in enumerate(shards)])


def test_facility_blocks_past_one_selection_estimate_f_and_never_return_less_than_quality_topk(
        overlapping):
    """Past one selection the whole-corpus f of facility location cannot be computed in one
    place; the route estimates it (quality exact, coverage on 8,192 rows sampled by id) and
    the estimate matches the exact f (computed here) within 4 standard errors. Where blocks
    are too small for this corpus's overlap, the corpus's quality top-k scores higher and is
    returned instead, named in the route, the blocks' own estimate kept beside it."""
    import torch

    from bench.corpus_facility import facility_f

    shards, x, q = overlapping
    cfg = LearnerConfig.profile("pipeline", algorithm="Facility", lamb=0.5)
    xt = torch.as_tensor(x)
    top = np.sort(np.argsort(-q, kind="stable")[:1000])
    res = select_corpus(shards, cfg, CorpusBudget.of(0.1), mode="exchange", gather_max_rows=0,
                        block_rows=128)
    assert res.route.startswith("greedy in ") and res.scored_by.startswith("quality exact")
    for name, rows in (("selection", _union_rows(res, shards)), ("quality_topk", top)):
        sc = res.scores[name]
        assert sc["clients"] == 8192
        assert abs(sc["f"] - facility_f(xt, q, rows, 0.5)) < 4 * 0.5 * sc["f_div_se"], name
    assert res.scores["selection"]["f"] > res.scores["quality_topk"]["f"]
    small = select_corpus(shards, cfg, CorpusBudget.of(0.1), mode="exchange",
                          gather_max_rows=0, block_rows=64)
    assert small.route.startswith("quality top-k (scored above greedy in ")
    assert np.array_equal(np.sort(_union_rows(small, shards)), top)
    assert small.scores["facility_blocks"]["f"] < small.scores["selection"]["f"] == \
        small.scores["quality_topk"]["f"]


def test_the_candidates_double_within_the_coordinators_memory_bound(tmp_path, monkeypatch):
    """A round that swaps most of its candidates doubles them (a sorted cut moves its budget
    in fewer rounds), but never past CANDIDATE_BYTES of candidate rows on the coordinator:
    with the bound at a few rows a shard, every round stays under it and the exchange still
    converges above the per-file start."""
    from datamask_pipeline.engine.corpus import sharded
    from datamask_pipeline.engine.corpus.exchange import next_candidates

    assert next_candidates(16, 16, 16, 16, 16) == 32  # all swapped: doubled
    assert next_candidates(128, 128, 128, 128, 16) == 128  # 8 × base
    assert next_candidates(16, 16, 16, 16, 16, cap=24) == 24  # the memory bound
    assert next_candidates(16, 2, 16, 16, 16) == 16  # few swapped: kept
    d, shards = 16, 4
    assert sharded.candidate_cap(shards, d, 16) * 2 * shards * (12 * d + 24) \
        <= max(sharded.CANDIDATE_BYTES, 2 * 16 * shards * (12 * d + 24))

    uris = _files(tmp_path)
    cfg = LearnerConfig.profile("pipeline", algorithm="Pair_simi", lamb=0.5)
    budget = CorpusBudget.of(select_rows=180)
    log_dir = tmp_path / "log"
    log_dir.mkdir()
    free = select_corpus(_shards(uris, log_dir), cfg, budget, mode="exchange",
                         gather_max_rows=0, candidates=16, executor=InProcess())
    assert max(r["next_candidates"] for r in free.rounds) > 24  # it did double, past the bound below
    cap_rows = 24
    monkeypatch.setattr(sharded, "CANDIDATE_BYTES", cap_rows * 2 * shards * (12 * d + 24))
    bound = select_corpus(_shards(uris, log_dir), cfg, budget, mode="exchange",
                          gather_max_rows=0, candidates=16, executor=InProcess())
    assert all(r["candidates"] <= cap_rows and r["next_candidates"] <= cap_rows
               for r in bound.rounds)
    assert sum(bound.counts.values()) == 180
    start = bound.rounds[0]["f_before"]
    assert bound.scores["selection"]["f"] > start
    assert bound.scores["selection"]["f"] >= free.scores["selection"]["f"] - 1e-3
