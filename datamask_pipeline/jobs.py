"""Jobs: the per-shard chain and the corpus summary."""

import dagster as dg

from assets.ingest import features
from assets.learn import mask
from assets.report import corpus_summary
from assets.select import selected_subset

CHAIN = dg.AssetSelection.assets(features, mask, selected_subset)

datamask_job = dg.define_asset_job(
    "datamask_job",
    selection=CHAIN,
    description="One shard end to end: ingestion -> blocking DuckDB checks -> mask learning "
    "(gpu pool) -> selected subset. Partitioned by shard (one run per partition).",
    # Run retries are the instance's (dagster.yaml run_retries), so UI launches and backfills
    # of the assets get them too.
)

corpus_summary_job = dg.define_asset_job(
    "corpus_summary_job",
    selection=dg.AssetSelection.assets(corpus_summary),
    description="Rebuild the corpus catalog (catalog.duckdb) over all selected shards.",
)
