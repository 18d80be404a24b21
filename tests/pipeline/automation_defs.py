"""Definitions for the daemon test of test_automation_daemon.py: the product's assets and
checks under automation with a scheduled refresh at 03:00, and the product's automation sensor.
Loaded by Dagster's workspace machinery from this file."""

import dagster as dg

from assets.ingest import features, raw_shard
from assets.learn import mask
from assets.report import corpus_summary
from assets.select import selected_subset
from assets.shard_report import shard_report
from assets.validate import validate_features
from datamask_pipeline import automation
from datamask_pipeline.definitions import resources_from_env

REFRESH = "0 3 * * *"

defs = dg.Definitions(
    assets=automation.automate_with(
        [raw_shard, features, mask, shard_report, selected_subset, corpus_summary], refresh=REFRESH, scope="per_shard"),
    asset_checks=[validate_features],
    sensors=[automation.automation_sensor(dg.AssetSelection.all()
                                          - dg.AssetSelection.assets(raw_shard.key))],
    resources=resources_from_env(),
)
