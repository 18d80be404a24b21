"""Token budgets past one process (engine/corpus/token_fit.py): the quality-ordered fit run as
one task per shard gives exactly ``budget.fit_tokens``'s selection on the gathered corpus
(ties in quality, a huge document, rows of 0 tokens, keep masks, starts over and under the
target, a refined histogram bin and a tail in several passes), and no shard's token counts are
read by the coordinator, in this process or on Ray tasks."""

import functools
import os

import numpy as np
import pyarrow.parquet as pq
import pytest

from datamask_pipeline.engine.config import LearnerConfig
from datamask_pipeline.engine.corpus import CorpusBudget, CorpusShard, Part, fit_tokens, \
    select_corpus
from datamask_pipeline.engine.corpus import token_fit
from datamask_pipeline.engine.corpus.executor import InProcess
from datamask_pipeline.engine.corpus.token_fit import fit_sharded, token_totals
from datamask_pipeline.engine.data import read_shard

from .test_corpus_sharded import _files, load_logged


def _part(q, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((q.size, 4)).astype(np.float32)
    return Part(x, np.asarray(q, dtype=np.float64), np.arange(q.size))


def _corpus(seed, n=600, shards=4, ties=False, huge=False, zeros=False, keep=False,
            callable_tokens=False, clustered=False):
    rng = np.random.default_rng(seed)
    q = rng.random(n)
    if clustered:  # one bin of the first histogram holds nearly every row: refined
        q = 0.5 + q * 1e-9
        q[rng.integers(n)] = 100.0
    if ties:
        q = np.round(q, 1)  # heavy ties
    tok = rng.integers(1, 400, n)
    if huge:
        tok[rng.integers(n)] = 1_000_000
    if zeros:
        tok[rng.random(n) < 0.1] = 0
    cuts = np.sort(rng.choice(np.arange(1, n), shards - 1, replace=False))
    out = []
    for i, r in enumerate(np.split(np.arange(n), cuts)):
        t = tok[r]
        m = rng.random(r.size) > 0.2 if keep else None
        out.append(CorpusShard(
            key=f"s{i}", n=r.size, load=functools.partial(_part, q[r], seed + i),
            tokens=(functools.partial(np.array, t) if callable_tokens else t), keep=m))
    return out


def _gathered(kept):
    q = np.concatenate([np.asarray(s.load().quality) for s in kept])
    tok = np.concatenate([s.token_counts() for s in kept])
    return q, tok


CASES = [dict(), dict(ties=True), dict(huge=True), dict(zeros=True), dict(keep=True),
         dict(ties=True, huge=True, zeros=True, keep=True, callable_tokens=True),
         dict(n=50, shards=7, ties=True), dict(clustered=True, keep=True)]


@pytest.mark.parametrize("case", range(len(CASES)))
@pytest.mark.parametrize("start", ["none", "over", "under"])
def test_the_sharded_fit_is_fit_tokens_on_the_gathered_corpus(case, start, monkeypatch):
    kept = [s.kept() for s in _corpus(case, **CASES[case])]
    q, tok = _gathered(kept)
    rng = np.random.default_rng(case)
    offsets = np.cumsum([0] + [s.n for s in kept])
    levels = 0
    for target in (1, int(tok.sum() * 0.05), int(tok.sum() * 0.3), int(tok.sum()) - 1):
        sel = np.zeros(q.size, dtype=bool)
        if start != "none":
            sel[rng.choice(q.size, q.size // (2 if start == "over" else 20), replace=False)] = True
        want = fit_tokens(sel, q, tok, target)
        for small in (False, True):  # small: refined bins and a tail in many passes
            if small:
                monkeypatch.setattr(token_fit, "VALUES_MAX", 2)
                monkeypatch.setattr(token_fit, "TAIL_BASE", 1)
            starts = [np.flatnonzero(sel[offsets[i]:offsets[i + 1]]) for i in range(len(kept))]
            got = fit_sharded(InProcess(), kept, target, starts, want_rows=True)
            if small:
                levels = max(levels, got["levels"])
            rows = np.concatenate([r + offsets[i] for i, r in enumerate(got["rows"])])
            assert np.array_equal(np.sort(rows), np.flatnonzero(want)), (case, start, target)
            assert got["tokens"] == int(tok[want].sum()) <= target
            monkeypatch.undo()
    if CASES[case].get("clustered"):
        assert levels > 1  # a pivot's bin was refined


def test_token_totals_are_the_shards_sums_and_largest_document():
    kept = [s.kept() for s in _corpus(3, huge=True, keep=True)]
    _, tok = _gathered(kept)
    got = token_totals(InProcess(), kept)
    assert got["total"] == int(tok.sum()) and got["largest"] == int(tok.max())


@pytest.mark.parametrize("mode,lamb,block_rows", [("per_shard", 0.5, None),
                                                   ("exchange", 0.2, 128)])
def test_a_token_budget_is_the_row_selection_fitted_by_quality(mode, lamb, block_rows):
    """Facility's token fit by quality selects what fit_tokens selects on the gathered
    corpus from the same row-budget selection: per_shard's (ShardedRun.fit_tokens), and the
    corpus route's blocks (their rows left in the run's state by each shard's task; both runs
    return the blocks' own rows: no guard at λ = 0.2 here)."""
    shards = _corpus(11, n=900, shards=3, ties=True, keep=True)
    kept = [s.kept() for s in shards]
    q, tok = _gathered(kept)
    cfg = LearnerConfig.profile("pipeline", algorithm="Facility", lamb=lamb)
    target = int(tok.sum() * 0.2)
    res = select_corpus(shards, cfg, CorpusBudget.of(select_tokens=target), mode=mode,
                        gather_max_rows=0, block_rows=block_rows)
    k = CorpusBudget.of(select_tokens=target).rows(q.size, int(tok.sum()))
    rows = select_corpus(shards, cfg, CorpusBudget.of(select_rows=k), mode=mode,
                         gather_max_rows=0, block_rows=block_rows)
    if mode == "exchange":
        assert res.route == rows.route and res.route.startswith("greedy in ")
    offsets = np.cumsum([0] + [s.n for s in kept])
    sel = np.zeros(q.size, dtype=bool)
    for i, s in enumerate(kept):
        sel[s.kept_rows(rows.selected[s.key]) + offsets[i]] = True
    want = fit_tokens(sel, q, tok, target)
    for i, s in enumerate(kept):
        assert np.array_equal(res.selected[s.key],
                              s.own_rows(np.flatnonzero(want[offsets[i]:offsets[i + 1]])))
    assert res.tokens["selected"] == int(tok[want].sum()) <= target
    assert res.tokens["corpus"] == int(tok.sum()) and res.tokens["largest_document"] == tok.max()


# ------------------------------------------------------------------ where counts are read
IN_TASK = {"on": False}


class Watched(InProcess):
    """In this process, with a flag up while a task runs."""

    def map(self, fn, args, shared=None):
        IN_TASK["on"] = True
        try:
            return super().map(fn, args, shared)
        finally:
            IN_TASK["on"] = False


def tokens_logged(uri: str, log_dir: str):
    """A shard's token counts (its row count's worth, from its quality), read where the task
    runs; the reading process leaves its pid and whether a task was running."""
    with open(os.path.join(log_dir, f"{os.getpid()}-{int(IN_TASK['on'])}-"
                                    f"{os.path.basename(uri)}"), "a") as fh:
        fh.write("1\n")
    q = np.asarray(read_shard(uri).quality)
    return (20 + np.round(q * 300)).astype(np.int64)


def _token_shards(uris, log_dir, keep):
    loads = log_dir / "features"
    loads.mkdir()
    return [CorpusShard(key=f"f{i:02d}", n=pq.ParquetFile(u).metadata.num_rows,
                        load=functools.partial(load_logged, u, str(loads)),
                        tokens=functools.partial(tokens_logged, u, str(log_dir)),
                        keep=keep[i]) for i, u in enumerate(uris)]


@pytest.fixture(scope="module")
def ray_two_cpus():
    ray = pytest.importorskip("ray", reason="the ray extra is part of the test extra")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield
    ray.shutdown()


@pytest.mark.parametrize("term,mode", [("Pair_simi", "exchange"), ("Pair_simi", "per_shard"),
                                       ("Facility", "per_shard")])
def test_no_shard_token_counts_are_read_by_the_coordinator(tmp_path, ray_two_cpus, term, mode):
    from datamask_pipeline.engine.corpus.executor import RayTasks

    uris = _files(tmp_path, n=1200, files=4)
    cfg = LearnerConfig.profile("pipeline", algorithm=term, lamb=0.7)
    rng = np.random.default_rng(1)
    keep = [rng.random(pq.ParquetFile(u).metadata.num_rows) > 0.1 for u in uris]
    logs = {name: tmp_path / name for name in ("local", "ray")}
    for d in logs.values():
        d.mkdir()
    budget = CorpusBudget.of(select_tokens=20_000)
    here = select_corpus(_token_shards(uris, logs["local"], keep), cfg, budget, mode=mode,
                         gather_max_rows=0, executor=Watched(), max_rounds=3)
    there = select_corpus(_token_shards(uris, logs["ray"], keep), cfg, budget, mode=mode,
                          gather_max_rows=0, executor=RayTasks(), max_rounds=3)
    assert there.selected.keys() == here.selected.keys()
    for key in here.selected:
        assert np.array_equal(there.selected[key], here.selected[key]), key
    assert there.tokens == here.tokens and here.tokens["selected"] <= 20_000
    assert here.tokens["target"] - here.tokens["largest_document"] < here.tokens["selected"]
    # in this process: every count read inside a task; on Ray: never in this process
    local = [f for f in os.listdir(logs["local"]) if f != "features"]
    assert local and all(name.split("-")[1] == "1" for name in local)
    names = [f for f in os.listdir(logs["ray"]) if f != "features"]
    assert names and str(os.getpid()) not in {name.split("-")[0] for name in names}
    assert {name.split("-", 2)[2] for name in names} == \
        {os.path.basename(u) for u in uris}
