"""Issue 5, item 3: parallel partitions.

A backfill of 8 partitions as concurrent runs against one Dagster home on tmpfs (the
repository's dagster.yaml, the "gpu" pool set to 4 slots): 4 worker processes start their runs at the same
moment, 2 partitions each, through the product's ``datamask_job`` and resources. Then the
corpus summary builds the DuckDB catalog. Checked:

* every run succeeded, no lock error anywhere (worker output, event logs);
* at least 3 runs were in flight at once (from the runs' own start/end events);
* every selected row is present exactly once: ``selected_per_shard/<key>.parquet`` holds exactly the
  rows the mask selected (no loss, no duplicate), and the catalog's ``selected_rows`` view and
  ``shards`` table agree;
* a second identical backfill is idempotent: features, masks and selected parquet files are
  byte-identical, data versions identical, the catalog's rows identical (the DuckDB file
  itself is not byte-identical: it records when it was built).

Slow variant: the same backfill through the multiprocess executor (every step its own
process).
"""

import glob
import json
import os
import re
import subprocess
import sys
import time

import dagster as dg
import duckdb
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from dagster_duckdb import DuckDBResource

from assets.partitions import register_shards
from datamask_pipeline.engine.sample import generate_corpus
from resources.contract import DataContract
from resources.learner import MaskLearner
from resources.storage import DataRoot
from tests.pipeline.helpers import ALL_ASSETS

from .helpers import (
    DIM,
    K,
    REPO,
    ROWS,
    SECRET_SENTINEL,
    dagster_env,
    max_overlap,
    read_bytes,
    run_windows,
)

N_PARTITIONS, WORKERS = 8, 4
KEYS = [f"shard_{i:03d}" for i in range(N_PARTITIONS)]
LOCK = re.compile(r"database is locked|\block(ed|s)?\b|lockerror|could not (obtain|acquire)", re.I)


class Backfill:
    """WORKERS worker processes (tests/reliability/backfill_worker.py), each owning
    N_PARTITIONS / WORKERS partitions, started once for ``rounds`` identical backfills."""

    def __init__(self, env, base, tag, rounds, multiprocess=False):
        self.go = os.path.join(base, f"go_{tag}")
        self.procs, self.logs = [], []
        for w in range(WORKERS):
            args = [sys.executable, "-m", "tests.reliability.backfill_worker", self.go,
                    str(rounds), *KEYS[w::WORKERS]]
            if multiprocess:
                args.append("--multiprocess")
            out, err = f"{self.go}.{w}.out", f"{self.go}.{w}.err"
            self.logs.append((out, err))
            with open(out, "w") as fo, open(err, "w") as fe:
                self.procs.append(subprocess.Popen(args, cwd=str(REPO), env=env, stdout=fo,
                                                   stderr=fe))
        deadline = time.monotonic() + 300
        while len(glob.glob(self.go + ".ready.*")) < WORKERS:
            self._alive(deadline)
            time.sleep(0.05)

    def _alive(self, deadline):
        assert time.monotonic() < deadline, "workers too slow"
        for p, (_o, e) in zip(self.procs, self.logs):
            assert p.poll() is None or p.returncode == 0, open(e).read()[-4000:]

    def _records(self):
        recs = []
        for out, _ in self.logs:
            with open(out) as fh:
                recs += [json.loads(x) for x in fh if x.startswith("{")]
        return recs

    def run_round(self, rnd, timeout=600) -> dict:
        open(f"{self.go}.{rnd}", "w").close()
        deadline = time.monotonic() + timeout
        while True:
            runs = {r["key"]: r for r in self._records() if r["round"] == rnd}
            if len(runs) == N_PARTITIONS:
                break
            self._alive(deadline)
            time.sleep(0.1)
        text = "\n".join(open(o).read() + open(e).read() for o, e in self.logs)
        return {"runs": runs, "output": text}

    def close(self):
        for p, (_o, e) in zip(self.procs, self.logs):
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            assert p.returncode == 0, open(e).read()[-4000:]


def _resources(root):
    return {"data_root": DataRoot(root=root), "contract": DataContract(expected_dim=DIM),
            "learner": MaskLearner(device="cpu", cpu_threads=1, shard_report=False),
            "duckdb": DuckDBResource(database=":memory:"),
            "catalog": DuckDBResource(database=DataRoot(root=root).catalog())}


def _outputs(root) -> dict:
    out = {}
    for d in ("features", "masks", "selected_per_shard"):
        for p in sorted(glob.glob(os.path.join(root, d, "*"))):
            out[os.path.relpath(p, root)] = read_bytes(p)
    return out


def _catalog_rows(path) -> dict:
    con = duckdb.connect(path, read_only=True)
    try:
        return {
            "shards": con.execute("SELECT * FROM shards ORDER BY partition_key").fetchall(),
            "info": con.execute("SELECT data_root, shards_registered, shards_without_selection "
                                "FROM catalog_info").fetchall(),
            "rows": con.execute("SELECT partition_key, chunk_id, quality_score, text "
                                "FROM selected_rows ORDER BY partition_key, chunk_id").fetchall(),
        }
    finally:
        con.close()


def _check_backfill(env, root, bf, multiprocess=False) -> dict:
    home = env["DAGSTER_HOME"]
    assert sorted(bf["runs"]) == KEYS
    assert all(r["success"] for r in bf["runs"].values()), bf["runs"]
    with dg.DagsterInstance.from_config(home) as inst:
        run_ids = [bf["runs"][k]["run_id"] for k in KEYS]
        windows = run_windows(inst, run_ids)
        concurrency = max_overlap(windows)
        event_text = "\n".join(str(e.message) + " " + str(e.user_message) for rid in run_ids
                               for e in inst.all_logs(rid))
        versions = {}
        for key in KEYS:
            for asset in ("features", "mask", "selected_subset"):
                recs = inst.fetch_materializations(dg.AssetRecordsFilter(
                    asset_key=dg.AssetKey(asset), asset_partitions=[key]), limit=1).records
                versions[(asset, key)] = recs[0].asset_materialization.tags["dagster/data_version"]
        # the catalog, built by the one unpartitioned asset that owns catalog.duckdb
        summary = dg.materialize(ALL_ASSETS, instance=inst, resources=_resources(root),
                                 selection=[dg.AssetKey("corpus_summary")])
        assert summary.success
    # zero lock errors
    for text in (bf["output"], event_text):
        assert not LOCK.findall(text), LOCK.findall(text)[:5]
    assert SECRET_SENTINEL not in bf["output"]
    assert concurrency >= 3, windows
    if multiprocess:
        assert "Launching subprocess for" in event_text or "multiprocess" in event_text.lower()
    # every selected row exactly once, no row lost
    data = DataRoot(root=root)
    total = 0
    for key in KEYS:
        m = pq.read_table(data.mask(key))
        chosen = m.filter(pc.field("selected")).column("id").to_pylist()
        got = pq.read_table(data.selected(key)).column("chunk_id").to_pylist()
        assert len(chosen) == K and sorted(got) == sorted(chosen) and len(set(got)) == len(got)
        total += len(got)
    assert total == K * N_PARTITIONS
    cat = _catalog_rows(data.catalog())
    assert [(s[0], s[4]) for s in cat["shards"]] == [(k, K) for k in KEYS]
    pairs = [(r[0], r[1]) for r in cat["rows"]]
    assert len(pairs) == len(set(pairs)) == K * N_PARTITIONS
    for key in KEYS:
        got = sorted(r[1] for r in cat["rows"] if r[0] == key)
        assert got == sorted(pq.read_table(data.selected(key)).column("chunk_id").to_pylist())
    return {"concurrency": concurrency, "versions": versions, "catalog": cat,
            "outputs": _outputs(root), "catalog_bytes": read_bytes(data.catalog())}


@pytest.fixture
def backfill_world(dagster_home, fast_dir):
    root = os.path.join(fast_dir, "data")
    generate_corpus(os.path.join(root, "raw"), n_shards=N_PARTITIONS, rows_per_shard=ROWS,
                    dim=DIM, seed=21)
    env = dagster_env(dagster_home, root)
    with dg.DagsterInstance.from_config(dagster_home) as inst:
        assert register_shards(inst, os.path.join(root, "raw"))["added"] == KEYS
        # one "gpu" slot per worker, as on a machine with one GPU per concurrent run
        # (`dagster instance concurrency set gpu 4`); the pool of one that serializes mask
        # steps is tested in tests/pipeline/test_cli.py
        inst.event_log_storage.set_concurrency_slots("gpu", WORKERS)
    return env, root, fast_dir


def test_parallel_backfill_concurrent_runs_and_idempotent_rerun(backfill_world):
    env, root, base = backfill_world
    t = [time.monotonic()]
    bf = Backfill(env, base, "inproc", rounds=2)
    t.append(time.monotonic())
    r1 = bf.run_round(1)
    t.append(time.monotonic())
    first = _check_backfill(env, root, r1)
    t.append(time.monotonic())
    second = _check_backfill(env, root, bf.run_round(2))
    t.append(time.monotonic())
    bf.close()
    print("\nphases (s): workers ready {:.1f}, backfill 1 {:.1f}, checks {:.1f}, backfill 2 + checks {:.1f}".format(
        *[b - a for a, b in zip(t, t[1:])]))
    print(f"\nparallel backfill: {N_PARTITIONS} partitions, max concurrency "
          f"{first['concurrency']} / {second['concurrency']} runs, "
          f"{K * N_PARTITIONS} rows selected, 0 lost")
    # idempotent: byte-identical parquet outputs, identical data versions and catalog rows
    assert set(first["outputs"]) == set(second["outputs"]) and len(first["outputs"]) == 3 * N_PARTITIONS
    assert [p for p in first["outputs"] if first["outputs"][p] != second["outputs"][p]] == []
    assert first["versions"] == second["versions"]
    assert first["catalog"] == second["catalog"]


@pytest.mark.slow
def test_parallel_backfill_with_multiprocess_executor(backfill_world):
    env, root, base = backfill_world
    bf = Backfill(env, base, "mp", rounds=1, multiprocess=True)
    first = _check_backfill(env, root, bf.run_round(1), multiprocess=True)
    bf.close()
    print(f"\nmultiprocess backfill: {N_PARTITIONS} partitions, max concurrency {first['concurrency']}")
    # and it selects exactly what the in-process executor selects
    bf = Backfill(env, base, "inproc", rounds=1)
    second = _check_backfill(env, root, bf.run_round(1))
    bf.close()
    assert [p for p in first["outputs"] if first["outputs"][p] != second["outputs"][p]] == []
