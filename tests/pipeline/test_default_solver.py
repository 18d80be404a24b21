"""The pipeline's default config (only the algorithm chosen) reaches at least the engine's exact
greedy on the whole-shard objective, for every built-in term, on the sample corpus."""

import pytest

from assets.learn import MaskConfig, read_features
from datamask_pipeline.engine.baselines import greedy
from datamask_pipeline.engine.evaluate import make_ground_set
from datamask_pipeline.engine.select import score_selection


@pytest.mark.parametrize("term", ["DiSF", "Facility", "Pair_simi"])
def test_default_config_reaches_greedy(term, registered, run_chain, data_root, resources):
    key = registered[0]
    result = run_chain(key, mask_config=None, algorithm=term)  # MaskConfig's defaults otherwise
    assert result.success
    md = {e.asset_key.to_user_string(): e.materialization
          for e in result.get_asset_materialization_events()}["mask"].metadata
    cfg = MaskConfig(algorithm=term).learner_config()
    assert md["solver"].value == cfg.solver == "auto"
    shard = read_features(data_root.features(key), resources["contract"])
    k = md["k_selected"].value
    g = greedy(shard.embeddings, shard.quality, k, term, cfg.lamb)
    ground = make_ground_set(shard.embeddings, shard.quality)
    f_greedy = score_selection(ground, g, cfg.diversity_term(), cfg.lamb).f
    assert md["f_datamask"].value >= f_greedy - 1e-9 * abs(f_greedy), (md["route"].value, f_greedy)
