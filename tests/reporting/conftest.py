"""Shared fixtures for the reporting tests: a real small shard from the sample generator, a
real (tiny) learner run and real whole-shard reference scores."""

from __future__ import annotations

import numpy as np
import pytest

from datamask_pipeline.engine import sample
from datamask_pipeline.engine.baselines import greedy, quality_topk, random_selection
from datamask_pipeline.engine.config import LearnerConfig
from datamask_pipeline.engine.data import table_to_shard
from datamask_pipeline.engine.evaluate import evaluate_selection, make_ground_set
from datamask_pipeline.engine.learner import learn

N, DIM = 600, 32
TINY = dict(select_ratio=0.1, n_epochs=40, n_rollout=16, partial=0.25, seed=0)


class ShardRun:
    """One shard, one learner run, and the reference selections scored on the whole shard."""

    def __init__(self, n=N, dim=DIM, algorithm="Pair_simi", lamb=0.5, seed=0, **cfg_kw):
        table = sample.make_table(n, dim=dim, seed=seed)
        shard = table_to_shard(table, "memory://tiny")
        self.table = table
        self.x, self.q, self.ids = shard.embeddings, shard.quality, shard.ids
        self.sources = np.asarray(table["source"].to_pylist(), dtype=object)
        self.algorithm, self.lamb = algorithm, lamb
        self.cfg = LearnerConfig(algorithm=algorithm, lamb=lamb, **{**TINY, **cfg_kw})
        self.result = learn(self.x, self.q, self.cfg, ids=self.ids, device="cpu")
        self.k = int(self.result.selected.sum())
        ground = make_ground_set(self.x, self.q)
        self.random_idx = random_selection(n, self.k, seed=1)
        self.topk_idx = quality_topk(self.q, self.k, self.ids)
        self.greedy_idx = greedy(self.x, self.q, self.k, algorithm, lamb)

        def ev(sel):
            return evaluate_selection(None, None, sel, lamb=lamb, terms=(algorithm,), ground=ground)

        self.reference = {
            "random": ev(self.random_idx),
            "quality_topk": ev(self.topk_idx),
            "greedy": ev(self.greedy_idx),
            "datamask": ev(self.result.selected),
        }


@pytest.fixture(scope="session")
def shard_run() -> ShardRun:
    return ShardRun()
