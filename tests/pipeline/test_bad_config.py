"""An impossible mask config is refused before any work (issue 20 item 17): in Python when
the config is built, and, given as raw run config (JSON, the Launchpad), in the run's first
step, which writes nothing, with one line naming the knob and no retry."""

import os

import dagster as dg
import pytest

from assets.learn import InvalidMaskConfig, MaskConfig

from .helpers import ALL_ASSETS, CHAIN, TINY


def _step_failures(result):
    return [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]


@pytest.mark.parametrize("knob, value, says", [
    ("select_ratio", 1.5, "select_ratio must be in (0, 1), got 1.5"),
    ("lamb", -0.1, "lamb (lambda) must be in [0, 1], got -0.1"),
    ("n_rollout", 1, "n_rollout must be >= 2, got 1"),
])
def test_python_config_is_refused_when_built(knob, value, says):
    with pytest.raises(InvalidMaskConfig) as err:
        MaskConfig(**{knob: value})
    assert str(err.value) == f"invalid mask configuration: {says}"
    assert isinstance(err.value, ValueError) and isinstance(err.value, dg.Failure)
    assert err.value.allow_retries is False


@pytest.mark.parametrize("config, says", [
    ({"select_ratio": 1.5}, "select_ratio must be in (0, 1), got 1.5"),
    ({"algorithm": "DiSFF"}, "unknown algorithm 'DiSFF'"),
    # needs the shard's size: 0.999 of 400 rows keeps all 400 (read from the raw footer)
    ({"select_ratio": 0.999}, "select_ratio=0.999 selects k=400 of n=400 rows"),
])
def test_raw_run_config_fails_the_first_step_and_writes_nothing(config, says, registered,
                                                                instance, resources, data_root):
    key = registered[0]
    result = dg.materialize(
        ALL_ASSETS, partition_key=key, instance=instance, resources=resources,
        selection=CHAIN, raise_on_error=False,
        run_config={"ops": {"mask": {"config": {**TINY, **config}}}})
    assert not result.success
    failures = _step_failures(result)
    assert [e.step_key for e in failures] == ["features"]  # the first step, and only it
    data = failures[0].step_failure_data
    desc = data.user_failure_data.description
    assert "invalid mask configuration" in desc and says in desc
    assert "\n" not in desc
    # nothing ran after it and nothing was written
    assert not result.get_asset_materialization_events()
    assert not result.get_asset_check_evaluations()
    assert not os.path.exists(data_root.features(key))
    assert not [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]


def test_mask_alone_with_a_raw_bad_config_fails_readably(registered, run_chain, instance,
                                                         resources):
    key = registered[0]
    assert run_chain(key).success  # features for the mask step to read
    result = dg.materialize(
        ALL_ASSETS, partition_key=key, instance=instance, resources=resources,
        selection=[dg.AssetKey("mask")], raise_on_error=False,
        run_config={"ops": {"mask": {"config": {**TINY, "select_ratio": 1.5}}}})
    assert not result.success
    (failure,) = _step_failures(result)
    assert failure.step_key == "mask"
    desc = failure.step_failure_data.user_failure_data.description
    assert desc == "invalid mask configuration: select_ratio must be in (0, 1), got 1.5"


def test_good_raw_config_still_runs(registered, instance, resources):
    key = registered[0]
    result = dg.materialize(
        ALL_ASSETS, partition_key=key, instance=instance, resources=resources,
        selection=CHAIN, run_config={"ops": {"mask": {"config": dict(TINY)}}})
    assert result.success
