"""The product's assets, checks and resources with the multiprocess executor (every step in its
own process), for the reliability tests:

    dagster asset materialize -m tests.reliability.mp_defs --select mask --partition KEY

The product's definitions use the in-process executor (the chain is sequential); the
multiprocess executor is what a deployment would pick to isolate steps, so the tests check
that crashes of step processes and parallel runs behave with it too.
"""

import dagster as dg

from assets.ingest import features, raw_shard
from assets.learn import mask
from assets.report import corpus_summary
from assets.select import selected_subset
from assets.shard_report import shard_report
from assets.validate import validate_features
from datamask_pipeline.definitions import resources_from_env
from datamask_pipeline.jobs import CHAIN, datamask_job

mp_chain_job = dg.define_asset_job(
    "mp_chain_job", selection=CHAIN, executor_def=dg.multiprocess_executor,
    tags=dict(datamask_job.tags),
)

defs = dg.Definitions(
    assets=[raw_shard, features, mask, shard_report, selected_subset, corpus_summary],
    asset_checks=[validate_features],
    jobs=[mp_chain_job],
    resources=resources_from_env(),
    executor=dg.multiprocess_executor,
)
