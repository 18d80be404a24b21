"""Snapshot of the definitions: asset keys, deps, partitions, groups, kinds, code versions,
checks, jobs, sensor, schedule, resources; and the config surface of the mask step."""

import json
import os
import subprocess
import sys

import dagster as dg

from assets.learn import MaskConfig, default_knobs_hash, mask
from datamask_pipeline import settings
from datamask_pipeline.definitions import defs
from datamask_pipeline.engine.config import LearnerConfig

EXPECTED_ASSETS = {
    # an observable source: executable = Dagster can observe it (its data versions)
    "raw_shard": dict(group="datamask", deps=[], partitions="shards", kinds=["parquet"],
                      code_version=None, executable=True),
    "features": dict(group="datamask", deps=["raw_shard"], partitions="shards",
                     kinds=["parquet", "pyarrow"], code_version="features-2", executable=True),
    # the logic's version + the default knobs' config hash: a new default makes masks stale
    "mask": dict(group="datamask", deps=["features"], partitions="shards", kinds=["torch"],
                 code_version="mask-2+cfg-" + default_knobs_hash(),
                 executable=True),
    "shard_report": dict(group="datamask", deps=["features", "mask"], partitions="shards",
                         kinds=["html", "matplotlib"], code_version="shard-report-1",
                         executable=True),
    "selected_subset": dict(group="datamask", deps=["features", "mask", "raw_shard"],
                            partitions="shards", kinds=["parquet", "pyarrow"],
                            code_version="selected-1", executable=True),
    "corpus_summary": dict(group="corpus", deps=["mask", "selected_subset", "shard_report"],
                           partitions=None, kinds=["duckdb"], code_version="catalog-3",
                           executable=True),
    # the corpus stage: one selection over every shard, then each shard's rows
    "corpus_dedup": dict(group="corpus", deps=["features", "raw_shard"], partitions=None,
                         kinds=["faiss", "parquet"], code_version="corpus-1", executable=True),
    "corpus_selection": dict(group="corpus", deps=["corpus_dedup", "features"], partitions=None,
                             kinds=["parquet", "pytorch"], code_version="corpus-1",
                             executable=True),
    "corpus_subset": dict(group="corpus", deps=["corpus_selection", "raw_shard"],
                          partitions=None, kinds=["parquet", "pyarrow"], code_version="corpus-1",
                          executable=True),
}
EXPECTED_CHECKS = {
    ("features", name): {"blocking": True}
    for name in ("schema", "non_empty", "unique_ids", "finite_quality", "embedding_dim",
                 "finite_nonzero_embeddings")
}
EXPECTED_JOBS = {
    "datamask_job": ["features", "mask", "selected_subset", "shard_report"],
    "corpus_summary_job": ["corpus_summary"],
    "features_job": ["features"],
    "corpus_job": ["corpus_dedup", "corpus_selection", "corpus_subset"],
}
# the presets' jobs run the same chain as datamask_job
EXPECTED_JOBS.update({name: EXPECTED_JOBS["datamask_job"]
                      for name in ("datamask_upstream_job", "datamask_cpu_demo_job")})


def _partitions(node):
    pdef = node.partitions_def
    if pdef is None:
        return None
    assert isinstance(pdef, dg.DynamicPartitionsDefinition)
    return pdef.name


def test_asset_graph_snapshot():
    graph = defs.resolve_asset_graph()
    actual = {}
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        actual[key.to_user_string()] = dict(
            group=node.group_name,
            deps=sorted(k.to_user_string() for k in node.parent_keys),
            partitions=_partitions(node),
            kinds=sorted(node.kinds),
            code_version=node.code_version,
            executable=node.is_executable,
        )
        assert node.description and len(node.description) > 40, key
    assert actual == EXPECTED_ASSETS

    checks = {(c.asset_key.to_user_string(), c.name): {"blocking": graph.get(c).blocking}
              for c in graph.asset_check_keys}
    assert checks == EXPECTED_CHECKS
    assert all(graph.get(c).description for c in graph.asset_check_keys)

    assert graph.get(dg.AssetKey("mask")).pools == {"gpu"}
    # every step that reads or writes storage retries a transient I/O error in the run, and
    # nothing else: no RetryPolicy (Dagster's retries any exception and every interrupt), the
    # body wrapped in retry_transient_io (tests/pipeline/test_transient_retries.py)
    from assets.ingest import TRANSIENT_DELAY_S, TRANSIENT_MAX_RETRIES
    for key in ("features", "mask", "shard_report", "selected_subset", "corpus_summary",
                "corpus_dedup", "corpus_selection", "corpus_subset"):
        op = defs.get_assets_def(key).op
        assert op.retry_policy is None, key
        assert op.compute_fn.decorated_fn.transient_retry == (TRANSIENT_MAX_RETRIES,
                                                               TRANSIENT_DELAY_S), key


def test_jobs_sensor_schedule_resources():
    jobs = {name: sorted(k.to_user_string()
                         for k in defs.resolve_job_def(name).asset_layer.executable_asset_keys)
            for name in EXPECTED_JOBS}
    assert jobs == EXPECTED_JOBS
    assert "dagster/max_retries" not in defs.resolve_job_def("datamask_job").tags  # the instance owns retries

    sensor = defs.resolve_sensor_def("raw_shard_sensor")
    assert not sensor.targets  # it registers and observes; automation launches
    assert sensor.default_status == dg.DefaultSensorStatus.STOPPED
    # one schedule: the corpus selection, on by default (tests/pipeline/test_corpus_schedule.py)
    [schedule] = defs.schedules
    assert schedule.name == "corpus_schedule" and schedule.job_name == "corpus_job"
    assert schedule.default_status == dg.DefaultScheduleStatus.RUNNING
    auto = defs.resolve_sensor_def("datamask_automation")
    assert auto.default_status == dg.DefaultSensorStatus.STOPPED and auto.emit_backfills

    assert set(defs.resources) == {"data_root", "contract", "learner", "duckdb", "catalog", "ray"}
    assert defs.resources["ray"].address is None  # unset: a local Ray, started only when used
    # the catalog's database is <data root>/catalog.duckdb (the data root of the load)
    assert os.path.basename(defs.resources["catalog"].database) == "catalog.duckdb"
    assert defs.resources["duckdb"].database == ":memory:"


def test_mask_config_covers_every_learner_knob():
    fields = MaskConfig.model_fields
    assert set(fields) == set(LearnerConfig.model_fields)
    assert all(f.description and len(f.description) > 20 for f in fields.values())
    # constants: the pipeline profile, whatever the environment says
    assert MaskConfig().model_dump() == settings.learner_defaults("pipeline")
    # another default would be another code version (the hash covers every knob)
    import hashlib

    def knobs_hash(d):
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:12]

    assert knobs_hash(MaskConfig().model_dump()) == default_knobs_hash()
    assert knobs_hash({**MaskConfig().model_dump(), "lamb": 0.25}) != default_knobs_hash()


def test_definitions_load_without_torch_and_default_to_the_pipeline_profile():
    """A fresh interpreter without DATAMASK_PRESET: the definitions load without importing
    torch, and MaskConfig's defaults are the engine's ``pipeline`` profile (solver auto)."""
    code = (
        "import json, sys\n"
        "from datamask_pipeline.definitions import defs\n"
        "from assets.learn import MaskConfig\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'config': MaskConfig().model_dump()}))\n"
    )
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("DATAMASK_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         cwd=str(settings.repo_root()), timeout=120)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["torch"] is False
    assert got["config"] == LearnerConfig.profile("pipeline").to_dict()
    assert got["config"]["solver"] == "auto"


def test_assets_carry_owners_stage_tags_and_freshness():
    """Every asset names its owners and its pipeline step; no asset carries a wall-clock
    freshness policy by default (issue 20 item 4: tests/pipeline/test_freshness.py)."""
    graph = defs.resolve_asset_graph()
    stages = {}
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        # raw_shard is an observable source, which cannot carry owners in Dagster 1.13
        assert node.owners == ([] if key.path == ["raw_shard"] else ["team:data-selection"]), key
        stages[key.to_user_string()] = node.tags.get("datamask/stage")
    assert stages == {"raw_shard": "ingest", "features": "ingest", "mask": "learn",
                      "selected_subset": "select", "corpus_summary": "report",
                      "shard_report": "report", "corpus_selection": "learn",
                      "corpus_dedup": "validate",
                      "corpus_subset": "select"}
    for name in ("selected_subset", "corpus_summary"):
        assert graph.get(dg.AssetKey(name)).freshness_policy is None
