"""The corpus catalog is rebuilt from the materialization records of ``selected_subset``,
``mask`` and ``shard_report`` (issue 20, item 6): no shard's file is opened when its records
are complete and agree with the files, so a rebuild costs a few event-log queries and one
listing instead of ~4 object-store requests per shard."""

import json
import os
import shutil

import dagster as dg
import duckdb

from resources.learner import MaskLearner

from .helpers import ALL_ASSETS

CHAIN_AND_REPORT = [dg.AssetKey(a) for a in ("features", "mask", "shard_report", "selected_subset")]


def _summarize(instance, resources):
    result = dg.materialize(ALL_ASSETS, instance=instance, resources=resources,
                            selection=[dg.AssetKey("corpus_summary")])
    return result.get_asset_materialization_events()[0].materialization.metadata


def _catalog(data_root):
    with duckdb.connect(data_root.catalog(), read_only=True) as con:
        return con.execute("SELECT * FROM shards ORDER BY partition_key").fetchall()


def _corpus_rows(data_root):
    with open(os.path.join(data_root.corpus_report_dir(), "corpus_metrics.json")) as fh:
        return json.load(fh)["shards"]


def test_catalog_builds_from_metadata_without_the_shards_files(registered, run_chain, instance,
                                                               resources, data_root):
    resources["learner"] = MaskLearner(device="cpu", cpu_threads=1, log_interval_s=0.5,
                                       shard_report=True)
    for key in registered:
        assert run_chain(key, selection=CHAIN_AND_REPORT).success
    meta = _summarize(instance, resources)
    assert meta["shards_in_catalog"].value == len(registered)
    assert meta["shards_read_from_files"].value == 0
    before, report_before = _catalog(data_root), _corpus_rows(data_root)
    assert all(r[-1] for r in before)  # report_uri: every shard's report is linked
    assert all(r["quality_mean_topk"] is not None for r in report_before)  # from the report

    # every per-shard file the old rebuild opened, except the selected subsets the catalog
    # points at (and the local selected_rows view reads), is gone: the rebuild needs none
    for sub in ("features", "masks", "reports"):
        shutil.rmtree(os.path.join(data_root.root, sub))
    meta = _summarize(instance, resources)
    assert meta["shards_in_catalog"].value == len(registered)
    assert meta["shards_without_selection"].value == []
    assert meta["shards_read_from_files"].value == 0
    assert _catalog(data_root) == before
    assert _corpus_rows(data_root) == report_before


def test_a_selection_older_than_its_mask_is_read_from_the_files(registered, run_chain, instance,
                                                                resources, data_root):
    for key in registered:
        assert run_chain(key).success
    assert _summarize(instance, resources)["shards_read_from_files"].value == 0
    # the mask is learned again (another seed) but its selection is not rebuilt: the records
    # no longer vouch for the selected file, so that shard is read from its files
    key = registered[1]
    mats = run_chain(key, selection=[dg.AssetKey("mask")], seed=11, lamb=0.3)
    mask_meta = mats.get_asset_materialization_events()[0].materialization.metadata
    meta = _summarize(instance, resources)
    assert meta["shards_read_from_files"].value == 1
    row = dict(zip(("partition_key", "f_selection", "lamb"), next(
        r for r in duckdb.connect(data_root.catalog(), read_only=True).execute(
            "SELECT partition_key, f_selection, lamb FROM shards").fetchall() if r[0] == key)))
    assert row["f_selection"] == mask_meta["f_datamask"].value and row["lamb"] == 0.3

    # a shard whose selected file is gone has no selection, whatever its records say
    os.unlink(data_root.selected(registered[0]))
    meta = _summarize(instance, resources)
    assert meta["shards_without_selection"].value == [registered[0]]
    assert meta["shards_in_catalog"].value == len(registered) - 1
