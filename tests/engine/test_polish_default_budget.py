"""The default polish ends in bounded, stated time that grows with n (issue 20 item 11): with
``polish_time_budget_s`` unset, select_shard caps the swap search at
max(120 s, 0.6 ms × n), records the budget and where it came from, and says when it bound; a
search that ends sooner returns what it returned without a cap."""

from types import SimpleNamespace

import numpy as np
import pytest

from datamask_pipeline.engine import polish as polish_mod
from datamask_pipeline.engine.config import LearnerConfig
from datamask_pipeline.engine.select import select_shard

from .test_baselines import _data


def _shard(n=300, d=8, seed=13):
    x, q = _data(n, d, seed=seed)
    return SimpleNamespace(embeddings=x.astype(np.float32), quality=q, ids=np.arange(n))


def test_default_budget_grows_with_n_and_is_600_s_at_a_million_rows():
    b = polish_mod.default_time_budget_s
    assert b(1_000) == b(200_000) == 120.0
    assert b(1_000_000) == pytest.approx(600.0)
    assert b(10_000_000) == pytest.approx(6_000.0)
    assert b(400_000) > b(300_000) > b(200_000)


@pytest.mark.parametrize("term", ["Pair_simi", "DiSF"])
def test_unset_budget_is_recorded_and_changes_nothing_where_the_search_ends_sooner(term):
    shard = _shard()
    cfg = LearnerConfig(algorithm=term, solver="topk+polish", seed=1)
    default = select_shard(shard, cfg, device="cpu", references=False)
    free = select_shard(shard, cfg.replace(polish_time_budget_s=1e9), device="cpu", references=False)
    assert default.polish["time_budget_s"] == 120.0
    assert default.polish["time_budget_source"].startswith("default: max(120 s, 0.6 ms × n) at n=300")
    assert free.polish["time_budget_s"] == 1e9
    assert free.polish["time_budget_source"] == "polish_time_budget_s"
    assert default.polish["stop"] != "time_budget" and default.polish["swaps"] > 0
    np.testing.assert_array_equal(default.selected, free.selected)
    assert default.scores["selection"] == free.scores["selection"]
    assert default.config_hash == cfg.config_hash()  # unset stays out of the hash
    assert not any("time budget" in n for n in default.notes)


def test_the_default_budget_binds_and_says_so(monkeypatch):
    """The default (here shrunk to ~0) stops the search, and the run says which budget."""
    monkeypatch.setattr(polish_mod, "DEFAULT_BUDGET_MIN_S", 1e-9)
    monkeypatch.setattr(polish_mod, "DEFAULT_BUDGET_S_PER_ROW", 1e-12)
    shard = _shard()
    cfg = LearnerConfig(algorithm="Pair_simi", solver="topk+polish", seed=1)
    sel = select_shard(shard, cfg, device="cpu", references=False)
    free = select_shard(shard, cfg.replace(polish_time_budget_s=1e9), device="cpu", references=False)
    assert sel.polish["stop"] == "time_budget" and not sel.polish["converged"]
    assert sel.polish["swaps"] < free.polish["swaps"]
    assert sel.polish["time_budget_s"] == pytest.approx(1e-9)
    assert any("stopped at its time budget" in n and "default:" in n for n in sel.notes)


def test_auto_at_a_million_rows_is_bounded_by_default():
    """The route ``auto`` takes for DiSF at 10^6 rows is a polish, and with the knob unset its
    search is capped (the 10^6 x 768 run in the README stopped at 600 s, the default there)."""
    from datamask_pipeline.engine.select import route_for

    cfg = LearnerConfig.profile("pipeline", algorithm="DiSF")
    assert cfg.polish_time_budget_s is None
    route, _ = route_for(cfg, 1_000_000)
    assert route.endswith("+polish")
    assert polish_mod.default_time_budget_s(1_000_000) == 600.0
