"""The Dagster definitions of DATAMASK: ``defs`` is the single entry point (pyproject's
[tool.dagster], workspace.yaml, ``dagster ... -m datamask_pipeline.definitions``).

Resources are built from the environment (see :mod:`datamask_pipeline.settings`). torch is
not imported here; the mask step imports it when it runs.
"""

import dagster as dg
from dagster_duckdb import DuckDBResource

from assets.corpus import corpus_dedup, corpus_selection, corpus_subset
from assets.ingest import features, raw_shard
from assets.learn import mask
from assets.report import corpus_summary
from assets.select import selected_subset
from assets.shard_report import shard_report
from assets.validate import validate_features
from resources.contract import DataContract
from resources.learner import MaskLearner
from resources.ray import ray_from_env
from resources.storage import DataRoot

from .automation import automate, automation_sensor
from .failures import shard_failure_sensor
from .schedules import schedules_from_env
from .jobs import (corpus_job, corpus_summary_job, datamask_cpu_demo_job, datamask_job,
                   datamask_upstream_job, features_job)
from .sensors import raw_shard_sensor


def resources_from_env() -> dict:
    """The resources, with every DATAMASK_* variable that is set as a ``dg.EnvVar`` (read when
    a run starts) and the documented defaults for the others (``settings``)."""
    from . import settings

    return {
        "data_root": DataRoot.from_env(),
        "contract": DataContract.from_env(),
        "learner": MaskLearner.from_env(),
        # In memory: every check step opens its own database, nothing is shared on disk.
        "duckdb": DuckDBResource(database=":memory:"),
        # The corpus catalog, rebuilt (atomically) by corpus_summary only. Its path is derived
        # from the data root, so it is fixed when the definitions load.
        "catalog": DuckDBResource(database=DataRoot(root=settings.data_root()).catalog()),
        # corpus_dedup's Ray cluster (engine: ray); lazy: nothing starts until such a run
        "ray": ray_from_env(),
    }


def _executor():
    from . import k8s

    if k8s.use_k8s_executor():
        from dagster_k8s import k8s_job_executor

        return k8s_job_executor.configured(k8s.k8s_executor_config())
    return dg.in_process_executor


# The corpus dedup and selection are launched by the corpus schedule (schedules.py, daily when
# shards changed) or by hand as corpus_job, never by a new file alone (a re-selection touches
# every shard's share); corpus_subset follows it eagerly.
SHARD_ASSETS = [raw_shard, features, mask, shard_report, selected_subset, corpus_summary]
CORPUS_ASSETS = [
    corpus_dedup,
    corpus_selection,
    corpus_subset.with_attributes(automation_condition=dg.AutomationCondition.eager()),
]


def make_defs(scope: str | None = None) -> dg.Definitions:
    """The definitions, with automation's ``scope`` (default: ``DATAMASK_AUTOMATION``, see
    ``automation``). ``defs`` below is the one every command loads."""
    return dg.Definitions(
        assets=automate(SHARD_ASSETS, scope=scope) + CORPUS_ASSETS,
        asset_checks=[validate_features],
        jobs=[datamask_job, datamask_upstream_job, datamask_cpu_demo_job, corpus_summary_job,
              features_job, corpus_job],
        # the corpus selection at DATAMASK_CORPUS_CRON (daily by default), when it is due
        schedules=schedules_from_env(),
        sensors=[raw_shard_sensor, shard_failure_sensor,
                 automation_sensor(dg.AssetSelection.all() - dg.AssetSelection.assets(raw_shard.key))],
        resources=resources_from_env(),
        # The chain is strictly sequential (features -> checks -> mask -> subset), so separate
        # step processes would buy no parallelism and cost a re-import (dagster, torch) per
        # step. Partitions run in parallel as separate runs; the "gpu" pool still limits mask
        # steps. On Kubernetes (DATAMASK_EXECUTOR=k8s, set by deploy/) every step is its own pod.
        executor=_executor(),
    )


defs = make_defs()
