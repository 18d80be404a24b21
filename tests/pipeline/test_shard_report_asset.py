"""The shard report as its own asset (after mask, outside the gpu pool), the selection record
in the mask file's metadata, and the corpus catalog built from files (no event log) and
replaced atomically."""

import hashlib
import json
import math
import os
import tempfile

import dagster as dg
import duckdb
import pyarrow.parquet as pq
import pytest
from dagster_duckdb import DuckDBResource

from assets.learn import mask
from assets.partitions import register_shards
from assets.report import rebuilt_database
from assets.shard_report import shard_report
from datamask_pipeline.jobs import CHAIN
from datamask_pipeline.engine.storage import mask_file
from datamask_pipeline.reporting.numerics import selection_label
from resources.learner import MaskLearner

from .conftest import _FAST_TMP
from .helpers import ALL_ASSETS, temp_leftovers

REPORT_RUN = ["features", "mask", "shard_report"]
CHAIN_AND_REPORT = ["features", "mask", "shard_report", "selected_subset"]


def _learner(report: bool) -> MaskLearner:
    return MaskLearner(device="cpu", cpu_threads=1, log_interval_s=0.5, shard_report=report)


def _mats(result) -> dict:
    return {e.asset_key.to_user_string(): e.materialization
            for e in result.get_asset_materialization_events()}


def _sha(path) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def _summarize(instance, resources, raise_on_error=True):
    return dg.materialize(ALL_ASSETS, instance=instance, resources=resources,
                          selection=[dg.AssetKey("corpus_summary")], raise_on_error=raise_on_error)


def test_report_asset_runs_after_mask_outside_the_gpu_pool(registered, run_chain, resources,
                                                           data_root):
    graph = dg.Definitions(assets=ALL_ASSETS, resources=resources).resolve_asset_graph()
    assert graph.get(dg.AssetKey("mask")).pools == {"gpu"}
    assert graph.get(dg.AssetKey("shard_report")).pools == set()
    assert mask.op.pool == "gpu" and shard_report.op.pool is None
    assert not any("gpu" in str(v).lower() for v in shard_report.op.tags.values())
    assert sorted(k.to_user_string() for k in graph.get(dg.AssetKey("shard_report")).parent_keys) \
        == ["features", "mask"]
    assert dg.AssetKey("shard_report") in CHAIN.resolve(graph)  # datamask_job's selection

    key = registered[0]
    resources["learner"] = _learner(True)
    # upstream's learner, so the report has an objective curve to draw
    result = run_chain(key, selection=[dg.AssetKey(a) for a in REPORT_RUN], solver="paper")
    assert result.success
    mats = _mats(result)
    assert set(mats) == set(REPORT_RUN)
    # the report step starts only after the mask step finished
    events = result.all_events
    mask_done = next(i for i, e in enumerate(events)
                     if e.step_key == "mask" and e.event_type_value == "STEP_SUCCESS")
    report_start = next(i for i, e in enumerate(events)
                        if e.step_key == "shard_report" and e.event_type_value == "STEP_START")
    assert mask_done < report_start

    mmeta, rmeta = mats["mask"].metadata, mats["shard_report"].metadata
    assert "report_html" not in mmeta and "report" not in mmeta  # mask builds no report
    assert rmeta["built"].value is True
    html = rmeta["report_html"].value
    assert html == os.path.join(data_root.report_dir(key), "report.html") and os.path.isfile(html)
    # the selection is named by its route, DATAMASK only where the learner ran (issue 20 item 13)
    report_md = rmeta["report"].value
    assert f"| {selection_label(mmeta['route'].value, mmeta['guard'].value)} |" in report_md
    assert ("DATAMASK" in report_md) == (mmeta["route"].value in ("paper", "paper+polish"))
    with open(os.path.join(data_root.report_dir(key), "report_metrics.json")) as fh:
        metrics = json.load(fh)
    assert mats["shard_report"].tags["dagster/data_version"] == \
        _sha(os.path.join(data_root.report_dir(key), "report_metrics.json"))
    assert rmeta["spectrum_flatness_selected"].value == metrics["spectrum_flatness_selected"]

    # the report's numbers are the mask's: they travel in the mask file's schema metadata
    record = mask_file.read_record(data_root.mask(key))
    raw_meta = pq.read_schema(data_root.mask(key)).metadata[b"datamask.selection"]
    assert json.loads(raw_meta)["scores"]["datamask"]["f"] == record.f("datamask")
    for name, prefix in (("datamask", "datamask"), ("quality_topk", "topk"), ("random", "random")):
        assert metrics[f"f_{prefix}"] == pytest.approx(record.f(name), rel=1e-12)
        assert mmeta[f"f_{name}"].value == record.f(name)
    assert mmeta["config_hash"].value == record.config_hash and record.k == metrics["k_selected"]
    assert len(mmeta["objective_history"].value) == len(record.history) > 0
    assert metrics["learner_steps"] == record.history[-1]["step"]


def test_report_switched_off_or_multi_term_materializes_not_built(registered, run_chain,
                                                                  resources, data_root):
    key = registered[0]
    resources["learner"] = _learner(True)
    assert run_chain(key, selection=[dg.AssetKey(a) for a in REPORT_RUN]).success
    assert os.path.isfile(os.path.join(data_root.report_dir(key), "report.html"))

    # MaskLearner.shard_report = false: a "not built" result, and the old report is gone
    resources["learner"] = _learner(False)
    result = run_chain(key, selection=[dg.AssetKey("shard_report")])
    meta = _mats(result)["shard_report"].metadata
    assert meta["built"].value is False and "disabled" in meta["reason"].value
    assert "report_html" not in meta and not os.path.exists(data_root.report_dir(key))

    # an objective of two diversity terms: the report draws one term, so none is built
    resources["learner"] = _learner(True)
    result = run_chain(key, selection=[dg.AssetKey(a) for a in REPORT_RUN],
                       terms={"DiSF": 1.0, "Pair_simi": 0.5})
    meta = _mats(result)["shard_report"].metadata
    assert meta["built"].value is False and "several diversity terms" in meta["reason"].value
    assert mask_file.read_record(data_root.mask(key)).single_term is None
    assert not os.path.exists(data_root.report_dir(key))


def test_mask_without_its_record_fails_the_report_naming_the_file(registered, run_chain,
                                                                  resources, data_root):
    key = registered[0]
    resources["learner"] = _learner(True)
    assert run_chain(key, selection=[dg.AssetKey("features"), dg.AssetKey("mask")]).success
    uri = data_root.mask(key)
    pq.write_table(pq.read_table(uri).replace_schema_metadata(None), uri)  # an older mask file
    result = run_chain(key, selection=[dg.AssetKey("shard_report")], raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    text = str(failure.event_specific_data.error)
    assert f"partition {key!r}" in text and uri in text and "datamask.selection" in text, text
    assert "re-materialize mask" in text


def test_corpus_summary_reads_scores_from_files_not_the_event_log(registered, run_chain,
                                                                   resources, data_root):
    resources["learner"] = _learner(True)
    for key in registered:
        assert run_chain(key, selection=[dg.AssetKey(a) for a in CHAIN_AND_REPORT]).success
    records = {k: mask_file.read_record(data_root.mask(k)) for k in registered}

    # a fresh instance: no mask materialization in its event log, only the files
    with tempfile.TemporaryDirectory(dir=_FAST_TMP) as home, \
            dg.instance_for_test(temp_dir=home) as fresh:
        assert register_shards(fresh, data_root.raw_root)["added"] == registered
        assert not fresh.fetch_materializations(dg.AssetKey("mask"), limit=1).records
        meta = _mats(_summarize(fresh, resources))["corpus_summary"].metadata
    assert meta["shards_in_catalog"].value == len(registered)
    assert meta["catalog_uri"].value == data_root.catalog()
    with duckdb.connect(data_root.catalog(), read_only=True) as con:
        rows = con.execute("SELECT partition_key, algorithm, lamb, f_selection, f_quality_topk, "
                           "f_random, f_qua_selection, f_div_selection, spectrum_flatness_selected, "
                           "report_uri, solver, route, guard FROM shards ORDER BY 1").fetchall()
        columns = [r[0] for r in con.execute("DESCRIBE shards").fetchall()]
    # scores are named by the route that produced them, not "datamask" (issue 20 item 13)
    assert not [c for c in columns if "datamask" in c]
    for row, key in zip(rows, registered):
        rec = records[key]
        assert row[:8] == (key, rec.term, rec.lamb, rec.f("datamask"), rec.f("quality_topk"),
                           rec.f("random"), rec.scores["datamask"]["f_qua"],
                           rec.scores["datamask"]["f_div"])
        with open(os.path.join(data_root.report_dir(key), "report_metrics.json")) as fh:
            assert row[8] == json.load(fh)["spectrum_flatness_selected"]
        assert row[9] == os.path.join(data_root.report_dir(key), "report.html")
        assert row[10:] == (rec.solver, rec.route, rec.guard) and row[11]
        assert all(math.isfinite(v) for v in row[2:9])


def test_failed_catalog_rebuild_leaves_the_old_catalog(registered, run_chain, instance,
                                                       resources, data_root):
    for key in registered:
        assert run_chain(key).success
    assert _summarize(instance, resources).success
    path = data_root.catalog()
    before = _sha(path)
    reader = duckdb.connect(path, read_only=True)  # a reader holding the catalog open
    try:
        # the last shard's subset loses a row: the rebuild fails after it began (its shard row
        # is computed in the new database)
        victim = data_root.selected(registered[-1])
        pq.write_table(pq.read_table(victim).slice(1), victim)
        result = _summarize(instance, resources, raise_on_error=False)
        assert not result.success
        failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
        assert "re-materialize selected_subset" in str(failure.event_specific_data.error)
        assert _sha(path) == before
        assert reader.execute("SELECT count(*) FROM shards").fetchone()[0] == len(registered)
    finally:
        reader.close()
    assert temp_leftovers(data_root.root) == []
    assert not [p for p in os.listdir(data_root.root) if p.endswith(".wal")]


def test_rebuilt_database_replaces_or_keeps_the_target(tmp_path):
    target = str(tmp_path / "cat" / "catalog.duckdb")
    resource = DuckDBResource(database=target, connection_config={"threads": 1})
    with rebuilt_database(resource) as con:
        con.execute("CREATE TABLE t AS SELECT 1 AS v")
        assert con.execute("SELECT current_setting('threads')").fetchone()[0] == 1
    old = duckdb.connect(target, read_only=True)
    try:
        with pytest.raises(RuntimeError, match="mid-rebuild"):
            with rebuilt_database(resource) as con:
                con.execute("CREATE TABLE t AS SELECT 2 AS v")
                raise RuntimeError("mid-rebuild")
        assert sorted(os.listdir(tmp_path / "cat")) == ["catalog.duckdb"]
        with rebuilt_database(resource) as con:
            con.execute("CREATE TABLE t AS SELECT 3 AS v")
        # the open reader keeps the catalog it opened; a new reader sees the new one
        assert old.execute("SELECT v FROM t").fetchall() == [(1,)]
    finally:
        old.close()
    with duckdb.connect(target, read_only=True) as con:
        assert con.execute("SELECT v FROM t").fetchall() == [(3,)]
    assert sorted(os.listdir(tmp_path / "cat")) == ["catalog.duckdb"]


def test_report_computes_on_the_cpu_whatever_the_learners_device(registered, run_chain,
                                                                 resources, data_root):
    """The report step holds no gpu pool slot, so it never opens the learner's device: with a
    learner configured for a GPU this machine does not have (CPU-only torch here, or a GPU
    busy elsewhere) the report still builds."""
    import torch

    key = registered[0]
    resources["learner"] = _learner(True)
    assert run_chain(key, selection=[dg.AssetKey("features"), dg.AssetKey("mask")]).success
    device = f"cuda:{torch.cuda.device_count()}"  # an index past the last GPU: never usable
    resources["learner"] = MaskLearner(device=device, cpu_threads=1, shard_report=True)
    threads = torch.get_num_threads()
    meta = _mats(run_chain(key, selection=[dg.AssetKey("shard_report")]))["shard_report"].metadata
    assert meta["built"].value is True and os.path.isfile(meta["report_html"].value)
    assert torch.get_num_threads() == threads  # the step's thread count is restored
