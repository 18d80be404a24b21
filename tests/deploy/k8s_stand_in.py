"""A stand-in for the pipeline's asset graph, shaped like the real one (features -> mask ->
selected_subset, mask in pool "gpu"), carrying the op tags of datamask_pipeline.k8s, run by
dagster-k8s's k8s_job_executor. The deploy tests build step pods for it exactly as the
executor does on a cluster; they do not need the real assets (which load torch and data).

Importable by module path (tests.deploy.k8s_stand_in) so that dagster can reconstruct the job
from a code pointer, as a run worker does."""

import dagster as dg
from dagster_k8s import k8s_job_executor

from datamask_pipeline import k8s

shards = dg.StaticPartitionsDefinition(["shard_000", "shard_001"])


@dg.asset(partitions_def=shards, op_tags=k8s.cpu_op_tags())
def features() -> None:
    """CPU step."""


@dg.asset(key="mask", partitions_def=shards, deps=[features], pool=k8s.GPU_POOL,
          op_tags=k8s.gpu_op_tags())
def mask() -> None:
    """GPU step."""


@dg.asset(partitions_def=shards, deps=[mask])
def selected_subset() -> None:
    """Untagged step: gets the executor's default (CPU) placement."""


def get_job() -> dg.JobDefinition:
    """The chain with the plain k8s_job_executor (configured by run config)."""
    defs = dg.Definitions(
        assets=[features, mask, selected_subset],
        jobs=[dg.define_asset_job("datamask_job", selection=[features, mask, selected_subset])],
        executor=k8s_job_executor,
    )
    return defs.resolve_job_def("datamask_job")
