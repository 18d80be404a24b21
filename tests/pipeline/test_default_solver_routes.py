"""The pipeline's default config (solver ``auto``) at a shard size where ``auto`` leaves the
route it takes on the 400-row sample (topk+polish): from about 5.8k rows facility location
runs on the sparse similarity and routes to greedy. The selection must be the route's own
(no guard), the route the one ``route_for`` names, and reach at least the engine's exact
greedy on the whole-shard objective."""

import pytest

from assets.learn import MaskConfig, read_features
from assets.partitions import register_shards
from datamask_pipeline.engine.baselines import greedy
from datamask_pipeline.engine.evaluate import make_ground_set
from datamask_pipeline.engine.sample import generate_corpus
from datamask_pipeline.engine.select import route_for, score_selection
from datamask_pipeline.engine.terms.base import default_mem_budget

from .helpers import DIM

ROWS_LARGE = 6000  # n*n float32 pairs * 2 > the CPU objective budget (256 MiB): sparse facility


@pytest.fixture
def large_shard(instance, data_root) -> str:
    generate_corpus(data_root.raw_root, n_shards=1, rows_per_shard=ROWS_LARGE, dim=DIM, seed=3)
    out = register_shards(instance, data_root.raw_root)
    assert len(out["added"]) == 1
    return out["added"][0]


# Facility: the sparse similarity's greedy route; the others: whatever route the table names
@pytest.mark.parametrize("term, route", [("Facility", "greedy"), ("DiSF", None),
                                         ("Pair_simi", None)])
def test_default_config_at_a_sparse_size(term, route, large_shard, run_chain, data_root,
                                         resources):
    import torch

    assert ROWS_LARGE**2 * 4 * 2 > default_mem_budget(torch.device("cpu"))
    cfg = MaskConfig(algorithm=term).learner_config()
    route = route or route_for(cfg, ROWS_LARGE, "cpu")[0]
    assert route_for(cfg, ROWS_LARGE, "cpu")[0] == route
    result = run_chain(large_shard, mask_config=None, algorithm=term)
    assert result.success
    md = {e.asset_key.to_user_string(): e.materialization
          for e in result.get_asset_materialization_events()}["mask"].metadata
    assert md["solver"].value == "auto" and md["route"].value == route
    assert not md["guard"].value  # the route's own selection, not a fallback
    shard = read_features(data_root.features(large_shard), resources["contract"])
    assert shard.n == ROWS_LARGE
    k = md["k_selected"].value
    # the engine's exact greedy on the objective the run is scored on (sparse facility here)
    g = greedy(shard.embeddings, shard.quality, k, cfg.diversity_term(), cfg.lamb)
    ground = make_ground_set(shard.embeddings, shard.quality)
    f_greedy = score_selection(ground, g, cfg.diversity_term(), cfg.lamb).f
    # float32 scoring noise only (sparse facility's topk+polish ends ~2e-4 below greedy here)
    assert md["f_datamask"].value >= f_greedy - 1e-6 * abs(f_greedy), (md["route"].value, f_greedy)
    if term == "Facility":  # the run's own similarity choice, as its notes record it
        assert cfg.diversity_term().mode(ROWS_LARGE, 4, default_mem_budget(torch.device("cpu"))) == "sparse"
    assert md["f_datamask"].value > md["f_quality_topk"].value
    assert md["f_datamask"].value > md["f_random"].value
