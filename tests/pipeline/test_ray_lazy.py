"""Issue 26, point 7: Ray starts only when a step uses it.

The product's definitions (``make_defs``: the ``ray`` resource from ``ray_from_env``) run
``corpus_job`` with ``corpus_dedup``'s default engine ``local``: no Ray is started (it was: the
resource's config schema carried dagster-ray's default lifecycle, which connects at every step
start, ~8 s of a local Ray per corpus run, disconnected after, so ``ray.is_initialized()``
afterwards could not see it). The run's records name the engine that ran.
"""

import glob
import json
import os

import dagster as dg

from assets.partitions import register_shards
from datamask_pipeline.definitions import make_defs

from .helpers import KEYS


def _ray_sessions() -> set:
    """Local Ray session directories (``ray.init`` of a local Ray creates one)."""
    base = os.environ.get("RAY_TMPDIR") or "/tmp"
    return set(glob.glob(os.path.join(base, "ray", "session_2*")))


def test_a_local_engine_corpus_run_starts_no_ray(instance, corpus, data_root):
    defs = make_defs()
    register_shards(instance, data_root.raw_root)
    everything = defs.resolve_implicit_global_asset_job_def()
    for key in KEYS:
        assert everything.execute_in_process(instance=instance, partition_key=key,
                                             asset_selection=[dg.AssetKey("features")]).success
    lifecycle = defs.resolve_job_def("corpus_job").resource_defs["ray"].config_schema \
        .as_field().config_type.fields["lifecycle"].default_value
    assert lifecycle["connect"] is False  # was True: dagster-ray's default reached the schema

    before = _ray_sessions()
    result = defs.resolve_job_def("corpus_job").execute_in_process(instance=instance)
    assert result.success
    messages = [e.message or "" for e in instance.all_logs(result.run_id)]
    assert not [m for m in messages if "Ray" in m and "Connected" in m], messages
    assert _ray_sessions() == before  # no local Ray was started
    import ray

    assert not ray.is_initialized()

    # the records name the engine that ran
    mat = instance.fetch_materializations(dg.AssetKey("corpus_dedup"), limit=1).records[0]
    assert mat.asset_materialization.metadata["engine"].value == "local"
    with open(os.path.join(data_root.corpus_dir(), "dedup.json")) as fh:
        assert json.load(fh)["engine"] == "local"
