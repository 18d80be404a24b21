"""Knobs that used to be claimed but not true: each test fails on the code before the fix."""

import warnings

import numpy as np
import pytest
import torch

from datamask_pipeline.engine import terms
from datamask_pipeline.engine.config import LearnerConfig, profile_defaults
from datamask_pipeline.engine.learner import learn
from datamask_pipeline.engine.sample import make_table


def _data(n=600, d=16, seed=0):
    t = make_table(n, dim=d, seed=seed)
    x = np.asarray(t.column("feature_arr").combine_chunks().flatten(), dtype=np.float32).reshape(n, d)
    return x.copy(), t.column("quality_score").to_numpy().copy()


class _Recording(terms.DiversityTerm):
    """Pair-wise similarity that records the rollout chunk it is asked to use."""

    name = "RecordingPairwise"
    seen: list = []

    def batched(self, batch, idx, chunk=None):
        _Recording.seen.append(chunk)
        return terms.get("Pair_simi").batched(batch, idx, chunk)


@pytest.fixture
def recording():
    _Recording.seen = []
    terms.register(_Recording, replace=True)
    yield _Recording
    terms.unregister("RecordingPairwise")


def test_rollout_chunk_reaches_the_objective_and_does_not_change_the_result(recording):
    x, q = _data()
    base = LearnerConfig(algorithm="RecordingPairwise", n_epochs=8, n_rollout=16, partial=0.3)
    a = learn(x, q, base.replace(rollout_chunk=3), device="cpu")
    assert set(recording.seen) == {3}
    recording.seen = []
    b = learn(x, q, base, device="cpu")
    assert set(recording.seen) == {None}
    np.testing.assert_allclose(a.logits, b.logits, rtol=0, atol=1e-6)
    assert base.replace(rollout_chunk=3).config_hash() == base.config_hash()


@pytest.mark.parametrize("n, prune", [(1000, 0.5), (5000, 0.4), (777, 0.3)])
def test_pruned_masks_keep_the_fraction_the_read_out_keeps(n, prune):
    sz = LearnerConfig(select_ratio=0.1, partial=0.2, prune_ratio=prune).sizes(n, learning=True)
    # the read-out keeps k of the pool; each mask keeps the same fraction of its batch
    assert abs(sz["k_batch"] / sz["batch"] - sz["k"] / sz["pool"]) <= 0.5 / sz["batch"] + 1e-12
    # e.g. n = 1000, prune 0.5: k = 100 of a pool of 500 (20%), masks of 20 of 100 (was 10)
    if (n, prune) == (1000, 0.5):
        assert (sz["k"], sz["pool"], sz["batch"], sz["k_batch"]) == (100, 500, 100, 20)


def test_without_pruning_masks_follow_select_ratio_as_upstream():
    sz = LearnerConfig(select_ratio=0.1, partial=0.1).sizes(5000, learning=True)
    assert sz["k_batch"] == round(0.1 * sz["batch"])


def test_old_preset_name_warns_and_means_upstream():
    from datamask_pipeline import settings

    with pytest.warns(DeprecationWarning, match="'paper' is deprecated: use 'upstream'"):
        old = settings.learner_defaults("paper")
    assert old == profile_defaults("upstream")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert settings.learner_defaults("pipeline")["solver"] == "auto"
