"""The per-shard chain through dg.materialize: ingestion -> blocking checks -> mask ->
selected subset, then the corpus catalog."""

import hashlib
import math
import os

import dagster as dg
import duckdb
import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from assets.learn import MaskConfig
from assets.validate import CHECKS
from resources.learner import MaskLearner

from .helpers import ALL_ASSETS, DIM, ROWS, TINY, temp_leftovers, tree_bytes

K = round(TINY["select_ratio"] * ROWS)


def _sha(path) -> str:
    with open(path, "rb") as fh:
        return hashlib.sha256(fh.read()).hexdigest()


def _mats(result) -> dict:
    return {e.asset_key.to_user_string(): e.materialization for e in result.get_asset_materialization_events()}


def test_chain_per_partition(registered, run_chain, data_root, resources):
    # shard 0: upstream's learner (solver paper); shard 1: the pipeline's default (auto)
    for key, report, solver in ((registered[0], True, "paper"), (registered[1], False, None)):
        resources["learner"] = MaskLearner(device="cpu", cpu_threads=1, log_interval_s=0.5,
                                         shard_report=report)
        overrides = {"solver": solver} if solver else {}
        result = run_chain(key, **overrides)
        assert result.success
        evals = result.get_asset_check_evaluations()
        assert {e.check_name for e in evals} == set(CHECKS)
        assert all(e.passed for e in evals), [e.description for e in evals if not e.passed]
        mats = _mats(result)
        assert set(mats) == {"features", "mask", "selected_subset"}
        raw = pq.read_table(data_root.raw_shard(key))

        # ---- features: canonical columns only, row for row as in the raw file
        fpath = data_root.features(key)
        feats = pq.read_table(fpath)
        assert feats.schema.names == ["id", "quality", "embedding"]
        assert feats.column("id").to_pylist() == raw.column("chunk_id").to_pylist()
        np.testing.assert_array_equal(feats.column("quality").to_numpy(),
                                      raw.column("quality_score").to_numpy())
        emb = np.stack(feats.column("embedding").to_numpy(zero_copy_only=False))
        assert emb.shape == (ROWS, DIM)
        fmeta = mats["features"].metadata
        assert fmeta["dagster/row_count"].value == ROWS
        assert [c.name for c in fmeta["dagster/column_schema"].schema.columns] == ["id", "quality", "embedding"]
        assert fmeta["bytes"].value == os.path.getsize(fpath)
        assert fmeta["sha256"].value == _sha(fpath)
        assert mats["features"].tags["dagster/data_version"] == _sha(fpath)
        assert mats["features"].tags["dagster/code_version"] == "features-2"

        # ---- mask: per-sample id / logit / rank / selected
        m = pq.read_table(data_root.mask(key))
        assert m.schema.names == ["id", "logit", "rank", "selected"]
        rank = m.column("rank").to_numpy()
        sel = m.column("selected").to_numpy(zero_copy_only=False)
        assert sorted(rank.tolist()) == list(range(ROWS))
        assert sel.sum() == K and np.array_equal(sel, rank < K)
        logit = m.column("logit").to_numpy()
        mmeta = mats["mask"].metadata
        cfg = MaskConfig(**{**TINY, **overrides}).learner_config()
        if solver == "paper":  # the read-out: top-k by final logit
            assert logit[sel].min() >= logit[~sel].max()
            assert mmeta["route"].value == "paper"
            assert mmeta["steps"].value == TINY["n_epochs"]
        else:  # auto: the bench's choice, never below quality top-k on the whole shard
            assert cfg.solver == "auto" and mmeta["solver"].value == "auto"
            assert mmeta["route"].value in ("paper+polish", "topk+polish", "sgreedy+polish")
            # the route's own selection (the guard returns quality top-k when it is not above
            # it, which would make a ">=" hold whatever the route did), strictly above top-k,
            # and the polish it ran recorded with that f
            assert not mmeta["guard"].value
            assert mmeta["f_datamask"].value > mmeta["f_quality_topk"].value + 1e-4
            pol = mmeta["polish"].value
            assert pol["swaps"] > 0 and pol["k"] == K
            assert pol["f_end"] == pytest.approx(mmeta["f_datamask"].value, rel=1e-5)
        for name in ("datamask", "quality_topk", "random"):
            for prefix in ("f_", "f_qua_", "f_div_"):
                assert math.isfinite(mmeta[f"{prefix}{name}"].value)
        assert mmeta["config_hash"].value == cfg.config_hash()
        assert mmeta["device"].value == "cpu"
        assert mmeta["resumed_from_step"].value == 0
        if mmeta["steps"].value:
            assert len(mmeta["objective_history"].value) > 0
            assert "| step |" in mmeta["objective_curve"].value
        assert mmeta["memory_estimate_bytes"].value > 0
        # the mask step builds no report, whatever the switch (the shard_report asset does)
        assert "report_html" not in mmeta and not os.path.exists(data_root.report_dir(key))
        # upstream data version recorded: what makes the UI show the mask stale when features change
        assert mats["mask"].tags["dagster/input_data_version/features"]
        assert not os.path.exists(data_root.checkpoint(key))  # removed once published

        # ---- selected subset: the selected raw rows, every raw column, raw order
        s = pq.read_table(data_root.selected(key))
        assert s.schema == raw.schema
        sel_ids = m.column("id").filter(m.column("selected"))
        expected = raw.filter(pc.is_in(raw.column("chunk_id"), value_set=sel_ids))
        assert s.equals(expected)
        smeta = mats["selected_subset"].metadata
        assert smeta["dagster/row_count"].value == K
        assert smeta["kept_fraction"].value == K / ROWS
        q = raw.column("quality_score").to_numpy()
        assert math.isclose(smeta["quality_mean_before"].value, q.mean())
        assert math.isclose(smeta["quality_mean_after"].value, expected.column("quality_score").to_numpy().mean())
        lineage = smeta["dagster/column_lineage"].column_lineage.deps_by_column
        assert set(lineage) == set(raw.schema.names)
        assert all(d.asset_key == dg.AssetKey("raw_shard") and d.column_name == c
                   for c, deps in lineage.items() for d in deps)
        assert [c.name for c in smeta["dagster/column_schema"].schema.columns] == raw.schema.names
        assert mats["selected_subset"].tags["dagster/data_version"] == _sha(data_root.selected(key))
    assert temp_leftovers(data_root.root) == []


def test_corpus_summary_catalog(registered, run_chain, instance, resources, data_root):
    for key in registered[:2]:
        run_chain(key)

    def summarize():
        r = dg.materialize(ALL_ASSETS, instance=instance, resources=resources,
                           selection=[dg.AssetKey("corpus_summary")])
        return r.get_asset_materialization_events()[0].materialization.metadata

    meta = summarize()
    assert meta["shards_in_catalog"].value == 2 and meta["rows_selected"].value == 2 * K
    assert meta["shards_without_selection"].value == [registered[2]]
    assert registered[0] in meta["per_shard"].value
    assert os.path.isfile(meta["corpus_report_html"].value)
    assert registered[1] in meta["corpus_report"].value
    path = data_root.catalog()
    with duckdb.connect(path, read_only=True) as con:
        rows = con.execute("SELECT partition_key, rows_raw, rows_selected, algorithm, f_selection, "
                           "f_quality_topk, f_random FROM shards ORDER BY 1").fetchall()
        assert [r[:4] for r in rows] == [(k, ROWS, K, "DiSF") for k in registered[:2]]
        assert all(math.isfinite(v) for r in rows for v in r[4:])
        by_shard = con.execute("SELECT partition_key, count(*), count(DISTINCT text) > 0 "
                               "FROM selected_rows GROUP BY 1 ORDER BY 1").fetchall()
        assert by_shard == [(k, K, True) for k in registered[:2]]

    run_chain(registered[2])
    meta = summarize()  # rebuilt from scratch, atomically replaced
    assert meta["shards_in_catalog"].value == 3 and meta["shards_without_selection"].value == []
    with duckdb.connect(path, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM selected_rows").fetchall()[0][0] == 3 * K
    files = tree_bytes(data_root.root)
    assert "catalog.duckdb" in files
    assert [p for p in files if p.startswith("catalog") or ".tmp-" in p or p.endswith(".wal")] == ["catalog.duckdb"]
    assert not [p for p in files if p.startswith("checkpoints")]  # removed once published
