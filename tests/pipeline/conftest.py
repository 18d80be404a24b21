"""Fixtures for the Dagster pipeline tests: a temporary data root, a tiny sample corpus
(3 shards x 400 rows, 16-d), a temporary Dagster instance, the resources, and a helper that
materializes the per-shard chain of one partition with the in-process executor.

MaskConfig's defaults (what schedules, sensors and a bare CLI run use) are the ``pipeline``
profile, read from no environment: solver ``auto``, which on these 400-row shards runs no
learner, so default runs stay fast. Tests that need the learner pass ``solver="paper"`` with
the ``TINY`` knobs.
"""

import os
import tempfile

import dagster as dg
import pytest
from dagster_duckdb import DuckDBResource

from assets.learn import MaskConfig
from assets.partitions import register_shards
from datamask_pipeline.engine.sample import generate_corpus
from resources.contract import DataContract
from resources.learner import MaskLearner
from resources.ray import RayCluster
from resources.storage import DataRoot

from .helpers import ALL_ASSETS, CHAIN, DIM, KEYS, ROWS, SHARDS, TINY


@pytest.fixture
def data_root(tmp_path, monkeypatch) -> DataRoot:
    root = tmp_path / "data"
    monkeypatch.setenv("DATAMASK_DATA_ROOT", str(root))
    monkeypatch.delenv("DATAMASK_RAW_ROOT", raising=False)
    return DataRoot(root=str(root))


@pytest.fixture
def corpus(data_root) -> list:
    """The tiny corpus under <data root>/raw; returns the partition keys."""
    generate_corpus(data_root.raw_root, n_shards=SHARDS, rows_per_shard=ROWS, dim=DIM, seed=3)
    return list(KEYS)


# The instance's sqlite storage commits every event; on a tmpfs that costs nothing, on a
# disk it costs a sync per event (seconds per run on a slow disk).
_FAST_TMP = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None


@pytest.fixture
def instance():
    with tempfile.TemporaryDirectory(dir=_FAST_TMP, prefix="datamask-dagster-home-") as home:
        with dg.instance_for_test(temp_dir=home) as inst:
            yield inst


@pytest.fixture
def resources(data_root) -> dict:
    return {
        "data_root": data_root,
        "contract": DataContract(expected_dim=DIM, quality_min=0.0, quality_max=1.0),
        "learner": MaskLearner(device="cpu", cpu_threads=1, log_interval_s=0.5,
                               shard_report=False),
        "duckdb": DuckDBResource(database=":memory:"),
        "catalog": DuckDBResource(database=data_root.catalog()),
        # corpus_dedup's (engine ray only; nothing starts otherwise): one CPU, no dashboard
        "ray": RayCluster(ray_init_options={"num_cpus": 1, "include_dashboard": False}),
    }


@pytest.fixture
def registered(instance, corpus, data_root) -> list:
    out = register_shards(instance, data_root.raw_root)
    assert out["added"] == corpus
    return corpus


def _selects_mask(selection) -> bool:
    if isinstance(selection, dg.AssetSelection):
        return selection is CHAIN
    return dg.AssetKey("mask") in [dg.AssetKey.from_coercible(k) for k in selection]


@pytest.fixture
def run_chain(instance, resources):
    """``run_chain(key, selection=CHAIN, raise_on_error=True, **mask_config)``: materialize
    the chain (with its blocking checks) for one partition; ``mask_config=None`` runs with
    MaskConfig's defaults."""

    def run(key, selection=CHAIN, raise_on_error=True, mask_config="tiny", **overrides):
        if mask_config == "tiny":
            cfg = MaskConfig(**{**TINY, **overrides})
        elif mask_config is None:
            cfg = MaskConfig(**overrides)
        else:
            cfg = mask_config
        return dg.materialize(
            ALL_ASSETS, partition_key=key, instance=instance, resources=resources,
            run_config=dg.RunConfig({"mask": cfg} if _selects_mask(selection) else {}),
            selection=selection,
            raise_on_error=raise_on_error,
        )

    return run
