"""Orchestration cost against the number of registered shards, on SQLite and on PostgreSQL.

    .venv/bin/python -m bench.orchestration [--shards 100,1000,10000] [--reps 3]
        [--storages sqlite,postgres] [--out DIR]

For each storage and each N, on fresh instances with N tiny raw files (the listing never reads
them), it times, ``--reps`` times each (median, min, max):

- ``sensor_first_tick``: ``raw_shard_sensor`` on N new shards (listing, cursor, one partition
  request; a new shard gets no observation): our code's part of a tick;
- ``daemon_apply``: what the daemon then does with that result, the instance calls of
  ``dagster/_daemon/sensor.py`` (``has_dynamic_partition`` per key, one
  ``add_dynamic_partitions``; no event recorded): Dagster's part, one fresh instance per rep;
- ``rewrite_apply``: the daemon's part when all N raw files were rewritten in place: N
  ``raw_shard`` observations recorded (``report_runless_asset_event`` each, as the daemon does:
  Dagster 1.13 has no batched call on that path). Measured up to ``--rewrite-max-shards``
  (every rep records N events: minutes at 10,000), one rep per size, on a fresh instance;
- ``sensor_steady_tick``: the sensor again with its cursor, nothing changed (our code);
- ``automation_first`` / ``automation_steady``, per automation variant (``--variants``):
  ``dg.evaluate_automation_conditions`` on the variant's definitions right after the N shards
  were registered (every shard requested), with the cursor of the evaluation before them, and
  the next evaluation (nothing to do). Variants: ``corpus`` (the product's default scope:
  ``features`` and its checks automated), ``per_shard`` (the per-shard chain:
  ``features``, ``mask``, ``shard_report``, ``selected_subset`` and the catalog), ``job``
  (Dagster 1.13's preview job-level condition: no asset condition, ``features_job`` carries
  ``any_job_root_assets_match`` of the shard condition);
- ``plan``: ``datamask_pipeline.plan.plan`` (the dry run, corpus scope; every shard missing).

The steady parts, the first automation evaluation and the plan run round-robin, one rep of
each per round. Growth slopes are log-log between consecutive sizes of the medians. PostgreSQL
is Debian's server, started by the bench on localhost in a temporary cluster (``initdb`` and
``pg_ctl`` as the ``postgres`` user when run as root) and stopped at the end; each instance
gets its own database and is built by ``DagsterInstance.from_config`` from a ``dagster.yaml``
with ``dagster_postgres`` storage.

Writes ``results_orchestration.json`` (rewritten after every cell). No timing is asserted
anywhere; the 10 s budget for our code's part is reported, not enforced.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import dagster as dg

from bench.common import cpu_model, loadavg

SCHEMA_VERSION = 1
OUR_TICK_LIMIT_S = 10.0
VARIANTS = ("corpus", "per_shard", "job")
BASE_PARTS = ("sensor_first_tick", "sensor_steady_tick", "daemon_apply", "rewrite_apply", "plan")


def parts(variants=VARIANTS) -> tuple:
    return BASE_PARTS + tuple(f"automation_{w}[{v}]" for v in variants
                              for w in ("first", "steady"))


PARTS = parts()
OURS = ("sensor_first_tick", "sensor_steady_tick")  # our code's part of a tick
BROWSER_SKIPPED = ("not measured: an instance with N shards needs N runs' worth of "
                   "materializations first, see REPORT_orchestration.md")
T0 = datetime(2026, 12, 3, 1, 5, tzinfo=timezone.utc)  # evaluations stay inside one hour
RESULTS = Path(__file__).resolve().parent / "results"
_FAST_TMP = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


# ------------------------------------------------------------------ timing helpers
def _stats(times: list) -> dict:
    return {"median_s": statistics.median(times), "min_s": min(times), "max_s": max(times),
            "all_s": times}


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def slopes(rows: list) -> dict:
    """{part: [{from, to, slope}]}: log-log slope of the medians between consecutive sizes."""
    out = {}
    for part in PARTS:
        pts = [(r["shards"], r[part]["median_s"]) for r in rows if r.get(part)]
        out[part] = [{"from": n1, "to": n2, "slope": math.log(t2 / t1) / math.log(n2 / n1)}
                     for (n1, t1), (n2, t2) in zip(pts, pts[1:]) if t1 > 0 and t2 > 0]
    return out


# ------------------------------------------------------------------ PostgreSQL
def _pg_bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (d / name).exists():
            return str(d / name)
    raise FileNotFoundError(f"PostgreSQL's {name} is not installed "
                            "(apt-get install -y postgresql)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """A throwaway PostgreSQL cluster on localhost (trust auth), one database per instance."""

    def __init__(self, base: str | None = None):
        self.dir = Path(tempfile.mkdtemp(prefix="datamask-pg-", dir=base))
        os.chmod(self.dir, 0o755)
        self.data, self.log = self.dir / "data", self.dir / "server.log"
        self.port = _free_port()
        self._as = []
        if os.geteuid() == 0:  # postgres refuses to run as root
            import pwd

            pw = pwd.getpwnam("postgres")
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
            self._as = ["runuser", "-u", "postgres", "--"]
        self._n = 0

    def _run(self, *cmd):
        proc = subprocess.run([*self._as, *cmd], capture_output=True, text=True, cwd=self.dir)
        if proc.returncode:
            raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): "
                               f"{(proc.stderr or proc.stdout).strip()}")
        return proc.stdout

    def start(self) -> "PostgresServer":
        self._run(_pg_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres",
                  "-E", "UTF8")
        self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-o",
                  f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1", "start")
        return self

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._run(_pg_bin("pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)

    def version(self) -> str:
        import psycopg2

        with contextlib.closing(psycopg2.connect(host="127.0.0.1", port=self.port,
                                                 user="postgres", dbname="postgres")) as con:
            return con.server_version and str(con.server_version)

    def new_database(self) -> str:
        import psycopg2

        self._n += 1
        name = f"datamask_bench_{self._n}"
        con = psycopg2.connect(host="127.0.0.1", port=self.port, user="postgres",
                               dbname="postgres")
        try:
            con.autocommit = True
            con.cursor().execute(f"CREATE DATABASE {name}")
        finally:
            con.close()
        return name

    @contextlib.contextmanager
    def instance(self, home: str):
        """A DagsterInstance built from a dagster.yaml with dagster_postgres storage."""
        db = self.new_database()
        Path(home, "dagster.yaml").write_text(
            "storage:\n  postgres:\n    postgres_db:\n      hostname: 127.0.0.1\n"
            f"      username: postgres\n      password: ''\n      db_name: {db}\n"
            f"      port: {self.port}\n"
            # SQLAlchemy 2.1 maps plain postgresql:// to psycopg 3; dagster-postgres
            # installs psycopg2
            "      scheme: postgresql+psycopg2\ntelemetry:\n  enabled: false\n")
        inst = dg.DagsterInstance.from_config(home)
        try:
            yield inst
        finally:
            inst.dispose()


# ------------------------------------------------------------------ the measured steps
def make_raw(root: Path, n: int) -> list:
    """N tiny files ``shard_<i>.parquet`` under ``root/raw``; returns the keys."""
    raw = root / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    keys = [f"shard_{i:06d}" for i in range(n)]
    for k in keys:
        (raw / f"{k}.parquet").write_bytes(b"PAR1")  # the listing never reads them
    return keys


def sensor_tick(instance, data_root, cursor=None) -> dg.SensorResult:
    """One evaluation of the product's raw-shard sensor (what the daemon calls)."""
    from datamask_pipeline.sensors import raw_shard_sensor

    with dg.build_sensor_context(instance=instance, cursor=cursor,
                                 resources={"data_root": data_root}) as ctx:
        out = raw_shard_sensor(ctx)
    return dg.SensorResult(skip_reason=out) if isinstance(out, dg.SkipReason) else out


def daemon_apply(instance, result: dg.SensorResult) -> None:
    """The instance calls the sensor daemon makes with a result (dagster/_daemon/sensor.py,
    ``_evaluate_sensor`` and ``_handle_dynamic_partitions_requests``, 1.13.27)."""
    for event in result.asset_events or []:
        instance.report_runless_asset_event(event)
    for req in result.dynamic_partitions_requests or []:
        new = [k for k in req.partition_keys
               if not instance.has_dynamic_partition(req.partitions_def_name, k)]
        if new:
            instance.add_dynamic_partitions(req.partitions_def_name, new)


def evaluate(instance, defs, cursor, at):
    return dg.evaluate_automation_conditions(defs, instance, cursor=cursor, evaluation_time=at)


def variant_defs(variant: str) -> dg.Definitions:
    """The definitions of an automation variant (see the module doc)."""
    from datamask_pipeline import automation, definitions

    if variant in automation.SCOPES:
        return definitions.make_defs(variant)
    if variant != "job":
        raise ValueError(f"unknown variant {variant!r} ({', '.join(VARIANTS)})")
    from assets.ingest import features
    from assets.validate import validate_features

    plain = [a.with_attributes(backfill_policy=automation.BACKFILL_POLICY)
             if isinstance(a, dg.AssetsDefinition) and a.partitions_def is not None
             and not a.is_observable else a for a in definitions.SHARD_ASSETS]
    job = dg.define_asset_job(
        "features_job", selection=dg.AssetSelection.assets(features),
        automation_condition=dg.AutomationCondition.any_job_root_assets_match(
            automation.shard_condition()))
    return dg.Definitions(assets=plain + definitions.CORPUS_ASSETS,
                          asset_checks=[validate_features], jobs=[job],
                          resources=definitions.resources_from_env())


def requested(result, defs) -> dict:
    """{asset: partitions requested} and, for job conditions, {"job:<name>": runs}."""
    from dagster._core.definitions.asset_key import AssetJobKey

    out = {}
    for key in defs.resolve_asset_graph().get_all_asset_keys():
        n = result.get_num_requested(key)
        if n:
            out[key.to_user_string()] = n
    for r in result.results:
        if isinstance(r.key, AssetJobKey) and r.true_subset.size:
            out[f"job:{r.key.job_name}"] = r.true_subset.size
    return out


def rewrite_all(instance, data_root, keys, cursor) -> dg.SensorResult:
    """Every raw file rewritten in place (new mtime): the sensor's tick that observes them."""
    later = time.time() + 120
    for k in keys:
        os.utime(data_root.raw_shard(k), (later, later))
    return sensor_tick(instance, data_root, cursor)


def measure(n: int, make_instance, workdir: Path, reps: int = 3, apply_reps: int | None = None,
            variants=VARIANTS, rewrite: bool = True) -> dict:
    """Every part at N shards on instances from ``make_instance(home)`` (a context manager).
    ``daemon_apply`` gets ``apply_reps`` fresh instances (default ``reps``); ``rewrite_apply``
    one more (one rep) when ``rewrite``."""
    apply_reps = reps if apply_reps is None else apply_reps
    from datamask_pipeline import plan as plan_mod
    from resources.storage import DataRoot

    defs = {v: variant_defs(v) for v in variants}
    root = Path(tempfile.mkdtemp(prefix=f"n{n}-", dir=workdir))
    keys = make_raw(root, n)
    data_root = DataRoot(root=str(root))
    row = {"shards": n, "loadavg_start": loadavg(), "apply_reps": apply_reps,
           "variants": list(variants)}
    times = {p: [] for p in parts(variants)}

    with contextlib.ExitStack() as stack:
        # daemon_apply: one fresh instance per rep (it changes the instance); the last one
        # carries on for the other parts.
        cursor0 = {}
        for rep in range(apply_reps):
            home = tempfile.mkdtemp(prefix="home-", dir=root)
            inst = stack.enter_context(make_instance(home)) if rep == apply_reps - 1 else None
            with contextlib.ExitStack() as local:
                if inst is None:
                    inst_r = local.enter_context(make_instance(home))
                else:
                    inst_r = inst
                    # the evaluation before the shards exist: its cursor is what the daemon
                    # carries into the evaluation right after them
                    cursor0 = {v: evaluate(inst_r, d, None, T0).cursor for v, d in defs.items()}
                    for _ in range(reps):  # first ticks change nothing: repeat them here
                        t, first = _timed(lambda: sensor_tick(inst_r, data_root))
                        times["sensor_first_tick"].append(t)
                first = sensor_tick(inst_r, data_root)
                assert not first.asset_events, "a new shard is registered, not observed"
                assert list(first.dynamic_partitions_requests[0].partition_keys) == keys
                t, _ = _timed(lambda: daemon_apply(inst_r, first))
                times["daemon_apply"].append(t)
        assert sorted(inst.get_dynamic_partitions("shards")) == keys

        steady_cursor, to_run = first.cursor, None
        row["requested_first"], row["requested_steady"] = {}, {}
        for rep in range(reps):  # round-robin
            at = T0 + timedelta(seconds=60 * (2 * rep + 1))
            for v, d in defs.items():
                t, res = _timed(lambda: evaluate(inst, d, cursor0[v], at))
                times[f"automation_first[{v}]"].append(t)
                cursor1, row["requested_first"][v] = res.cursor, requested(res, d)
                t, res2 = _timed(lambda: evaluate(inst, d, cursor1, at + timedelta(seconds=60)))
                times[f"automation_steady[{v}]"].append(t)
                row["requested_steady"][v] = requested(res2, d)
            t, tick = _timed(lambda: sensor_tick(inst, data_root, steady_cursor))
            times["sensor_steady_tick"].append(t)
            assert not tick.asset_events and not tick.dynamic_partitions_requests
            t, p = _timed(lambda: plan_mod.plan(inst, data_root, scope="corpus"))
            times["plan"].append(t)
            to_run = len(p.reasons)
        row["plan_to_run"] = to_run
        if rewrite:
            # a fresh instance with the N shards registered; then every file is rewritten
            with make_instance(tempfile.mkdtemp(prefix="home-rw-", dir=root)) as inst_w:
                tick = sensor_tick(inst_w, data_root)
                daemon_apply(inst_w, tick)
                again = rewrite_all(inst_w, data_root, keys, tick.cursor)
                assert len(again.asset_events) == n, "every rewritten shard is observed"
                t, _ = _timed(lambda: daemon_apply(inst_w, again))
                times["rewrite_apply"].append(t)
    shutil.rmtree(root, ignore_errors=True)
    for part, ts in times.items():
        row[part] = _stats(ts) if ts else None
    row["ours_max_median_s"] = max(row[p]["median_s"] for p in OURS)
    row["loadavg_end"] = loadavg()
    return row


def sqlite_instance(home: str):
    return dg.instance_for_test(temp_dir=home)


# ------------------------------------------------------------------ the run
def before_from(path: str) -> dict:
    """The medians of an earlier ``results_orchestration.json`` (its command and, per storage
    and size, what the daemon recorded for N new shards and the automation evaluations), kept
    in this run's results so that the report sets them side by side."""
    old = json.loads(Path(path).read_text())
    out = {"file": str(path), "command": old["command"], "storages": {},
           "loadavg": [old["machine"].get("loadavg_start"), old["machine"].get("loadavg_end")],
           "cpu_model": old["machine"].get("cpu_model")}
    for storage, cell in old.get("storages", {}).items():
        out["storages"][storage] = [
            {"shards": r["shards"],
             **{k: r[k]["median_s"] for k in ("daemon_apply", "automation_first",
                                                "automation_steady") if r.get(k)},
             "requested_first": r.get("requested_first")} for r in cell.get("rows", [])]
    return out


def _write(out: Path, res: dict) -> None:
    from datamask_pipeline.engine.storage import atomic_write_bytes

    atomic_write_bytes(str(out / "results_orchestration.json"),
                       json.dumps(res, indent=1).encode())
    atomic_write_bytes(str(out / "REPORT_orchestration.md"), report_markdown(res).encode())


# ------------------------------------------------------------------ the report
LABELS = {
    "sensor_first_tick": "sensor, first tick (N new) — ours",
    "sensor_steady_tick": "sensor, steady tick — ours",
    "daemon_apply": "daemon records N new shards (partitions, no event) — Dagster",
    "rewrite_apply": "daemon records N rewritten shards (N observations) — Dagster",
    "plan": "dry run `plan.plan` (corpus scope) — ours",
}
VARIANT_LABELS = {"corpus": "scope `corpus` (default: features + checks)",
                  "per_shard": "scope `per_shard` (the chain + catalog)",
                  "job": "job condition on `features_job` (preview)"}


def _label(part: str) -> str:
    if part in LABELS:
        return LABELS[part]
    w, v = part[len("automation_"):-1].split("[")
    when = "N new shards" if w == "first" else "steady"
    return f"automation evaluation, {when}, {VARIANT_LABELS.get(v, v)} — Dagster"


def _cell(st) -> str:
    if not st:
        return "not measured"
    return (f"{st['median_s']:.3g} s ({st['min_s']:.3g}–{st['max_s']:.3g}, "
            f"n={len(st['all_s'])})")


def report_markdown(res: dict) -> str:
    """REPORT_orchestration.md from the results (what ``main`` writes; a test re-renders the
    committed results and compares)."""
    variants = res["settings"].get("variants", list(VARIANTS))
    sizes = res["settings"]["shards"]
    m = res["machine"]
    lines = [f"# Orchestration at {', '.join(f'{n:,}' for n in sizes)} shards "
             f"({', '.join(res['storages'])})", "",
             "Produced by (written by the bench with the results, "
             "`bench/results/results_orchestration.json`):", "", "```",
             f"OMP_NUM_THREADS=1 .venv/bin/{res['command']}", "```", "",
             f"Machine: {m.get('cpu_count')} × {m.get('cpu_model')}, Python {m.get('python')}, "
             f"dagster {m.get('dagster')}"
             + (f", dagster-postgres {m['dagster_postgres']}" if m.get("dagster_postgres") else "")
             + f"; load average at start {m.get('loadavg_start')}, at end {m.get('loadavg_end')}; "
             f"total {res.get('total_s', 0) / 60:.1f} min. SQLite instances and the raw files "
             "live on `/dev/shm` (as in the tests); PostgreSQL is Debian's server in a temporary "
             "cluster on 127.0.0.1 (default settings: fsync on, data on disk). Wall time of each "
             "part, median (min–max, n reps); what each part is: the module doc of "
             "`bench/orchestration.py`.", ""]
    for storage, cell in res["storages"].items():
        lines += [f"## {storage}", ""]
        if cell.get("skipped"):
            lines += [cell["skipped"], ""]
            continue
        rows = cell["rows"]
        if cell.get("from"):
            lines += [f"Measured by `{cell['from']}` (load average "
                      f"{cell['machine'].get('loadavg_start')} → "
                      f"{cell['machine'].get('loadavg_end')}).", ""]
        lines += ["| part | " + " | ".join(f"{r['shards']:,} shards" for r in rows) + " | slopes |",
                  "|---|" + "---|" * len(rows) + "---|"]
        for part in parts(variants):
            sl = ", ".join(f"{x['slope']:.2f}" for x in cell.get("slopes", {}).get(part, []))
            lines.append(f"| {_label(part)} | " + " | ".join(_cell(r.get(part)) for r in rows)
                         + f" | {sl} |")
        for v in variants:
            lines.append(f"| requested right after, {v} | "
                         + " | ".join(str(r["requested_first"].get(v)) for r in rows) + " | |")
            lines.append(f"| requested when steady, {v} | "
                         + " | ".join(str(r["requested_steady"].get(v)) for r in rows) + " | |")
        lines.append("| load average at start / end | " + " | ".join(
            f"{r['loadavg_start']} / {r['loadavg_end']}" for r in rows) + " | |")
        lines += ["", f"Our code's part of a tick under {res['settings']['our_tick_limit_s']:g} s "
                  f"at every size: {'yes' if cell.get('ours_under_limit') else 'no'}.", ""]
    before = res.get("before") or {}
    if before.get("storages"):
        big = max(sizes)
        lines += [f"## Against the previous record, at {big:,} shards", "",
                  f"Previous: `{before['command']}` (`{before['file']}`): every new shard was "
                  "observed when registered, and all four per-shard assets were automated. "
                  f"That was another run ({before.get('cpu_model') or 'its CPU not recorded'}, "
                  f"load average {before.get('loadavg')}; this run: {m.get('cpu_model')}), so "
                  "these are not side-by-side ratios; the "
                  "side-by-side comparison is this run's `per_shard` variant (the previous "
                  "automation, evaluated in the same rounds), in the ratio table below.", "",
                  "| storage | part | previous | now |", "|---|---|---|---|"]
        for storage, old_rows in before["storages"].items():
            old = next((r for r in old_rows if r["shards"] == big), None)
            new = _row(res, storage, big)
            if not old or not new:
                continue
            lines.append(f"| {storage} | daemon records N new shards | "
                         f"{old.get('daemon_apply', float('nan')):.3g} s (N observations) | "
                         f"{_cell(new.get('daemon_apply'))} (partitions only) |")
            for w in ("first", "steady"):
                for v in variants:
                    lines.append(f"| {storage} | automation evaluation, {w}, {v} | "
                                 f"{old.get('automation_' + w, float('nan')):.3g} s | "
                                 f"{_cell(new.get(f'automation_{w}[{v}]'))} |")
        lines.append("")
    if "per_shard" in variants and len(variants) > 1:
        lines += ["## Side by side in this run: each variant's evaluation time over `per_shard`'s",
                  "", "Per rep (the variants ran in the same round, one after the other), then "
                  "the median and range of the per-rep ratios.", "",
                  "| storage | shards | evaluation | " + " | ".join(
                      v for v in variants if v != "per_shard") + " |",
                  "|---|---|---|" + "---|" * (len(variants) - 1)]
        for storage, cell in res["storages"].items():
            for r in cell.get("rows", []):
                for w in ("first", "steady"):
                    base = r.get(f"automation_{w}[per_shard]")
                    cols = []
                    for v in variants:
                        if v == "per_shard":
                            continue
                        st = r.get(f"automation_{w}[{v}]")
                        ratios = ([x / y for x, y in zip(st["all_s"], base["all_s"])]
                                  if st and base else [])
                        cols.append(f"{statistics.median(ratios):.3f} ({min(ratios):.3f}–"
                                    f"{max(ratios):.3f})" if ratios else "—")
                    lines.append(f"| {storage} | {r['shards']:,} | {w} | " + " | ".join(cols)
                                 + " |")
        lines.append("")
    return "\n".join(lines)


def _row(res: dict, storage: str, n: int) -> dict | None:
    """The results' row of ``storage`` at ``n`` shards (None when not measured)."""
    return next((r for r in res["storages"].get(storage, {}).get("rows", [])
                 if r["shards"] == n), None)


def _median(res: dict, storage: str, n: int, part: str) -> float | None:
    st = (_row(res, storage, n) or {}).get(part)
    return st["median_s"] if st else None


def readme_numbers(res: dict) -> str:
    """The README's "At N shards" sentence, rendered from the results at the largest size
    (SQLite / PostgreSQL medians; tests/engine/test_docs.py checks the README holds it)."""
    n = max(res["settings"]["shards"])
    stores = [s for s in ("sqlite", "postgres")
              if _median(res, s, n, "automation_first[corpus]") is not None]

    def both(part: str) -> str:
        vals = [_median(res, s, n, part) for s in stores]
        return " / ".join("—" if v is None else f"{v:.3g}" for v in vals) + " s"

    names = " / ".join({"sqlite": "SQLite", "postgres": "PostgreSQL"}[s] for s in stores)
    ours = max(max(_median(res, s, n, p) or 0.0 for p in OURS) for s in stores)
    return (f"At {n:,} shards, medians on {names}: our part of a sensor tick takes at most "
            f"{ours:.3g} s and the dry run {both('plan')}; the daemon registers {n:,} new "
            f"shards in {both('daemon_apply')} (partitions only: a new shard records no "
            f"event) and records {n:,} rewritten ones in {both('rewrite_apply')} (one "
            f"observation each); Dagster's automation evaluation takes "
            f"{both('automation_first[corpus]')} per tick in the default `corpus` scope and "
            f"{both('automation_first[per_shard]')} under `per_shard`.")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.orchestration",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--shards", default="100,1000,10000")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--storages", default="sqlite,postgres")
    ap.add_argument("--apply-reps-max-shards", type=int, default=10000,
                    help="above this N, daemon_apply is timed on one fresh instance only")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="automation variants to evaluate: " + ", ".join(VARIANTS))
    ap.add_argument("--rewrite-max-shards", type=int, default=1000,
                    help="measure rewrite_apply (N observations recorded, one rep) up to this N "
                    "(minutes at 10,000)")
    ap.add_argument("--workdir", default=_FAST_TMP, help="where SQLite instances and raw files "
                    "go (default: /dev/shm, as the tests: SQLite syncs every event on a disk)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--before", default=None, help="an earlier results_orchestration.json whose "
                    "medians the report sets beside this run's")
    ap.add_argument("--also", default=None,
                    help="an earlier results_orchestration.json of this bench whose storages "
                    "that this run does not measure join this run's results (its command is "
                    "listed with this one)")
    ap.add_argument("--report-only", action="store_true",
                    help="measure nothing: re-render REPORT_orchestration.md from --out's "
                    "results (with --before: attach that earlier run first)")
    a = ap.parse_args(argv)
    if a.report_only:
        out = Path(a.out)
        res = json.loads((out / "results_orchestration.json").read_text())
        if a.before:
            res["before"] = before_from(a.before)
        _write(out, res)
        return 0
    sizes = [int(x) for x in a.shards.split(",")]
    variants = tuple(v.strip() for v in a.variants.split(",") if v.strip())
    for v in variants:
        if v not in VARIANTS:
            ap.error(f"--variants: unknown variant {v!r} ({', '.join(VARIANTS)})")
    storages = [s.strip() for s in a.storages.split(",") if s.strip()]
    for s in storages:
        if s not in ("sqlite", "postgres"):
            ap.error(f"--storages: unknown storage {s!r} (sqlite, postgres)")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    os.environ.pop("DATAMASK_REFRESH_CRON", None)  # the default: no scheduled refresh
    workdir = Path(tempfile.mkdtemp(prefix="datamask-orch-", dir=a.workdir))
    os.environ["DATAMASK_DATA_ROOT"] = str(workdir / "defs-root")  # defs' resources
    os.environ.pop("DATAMASK_RAW_ROOT", None)
    from datamask_pipeline import automation

    start = time.perf_counter()
    res = {
        "schema_version": SCHEMA_VERSION,
        "command": "python -m bench.orchestration " + " ".join(argv if argv is not None
                                                               else sys.argv[1:]),
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpu_count": os.cpu_count(), "cpu_model": cpu_model(),
                    "dagster": dg.__version__,
                    "loadavg_start": loadavg(), "workdir": str(workdir)},
        "settings": {"shards": sizes, "reps": a.reps, "refresh_cron": automation.refresh_cron(),
                     "catalog_cron": automation.catalog_cron(),
                     "our_tick_limit_s": OUR_TICK_LIMIT_S, "ours": list(OURS),
                     "apply_reps_max_shards": a.apply_reps_max_shards,
                     "variants": list(variants), "rewrite_max_shards": a.rewrite_max_shards},
        "storages": {},
        "before": before_from(a.before) if a.before else None,
    }
    server = None
    try:
        for storage in storages:
            cell = res["storages"][storage] = {"rows": []}
            if storage == "postgres":
                try:
                    import dagster_postgres  # the bench extra: pip install -e '.[bench]'

                    res["machine"]["dagster_postgres"] = dagster_postgres.__version__
                    server = PostgresServer().start()  # data on disk, in the system temp dir
                    cell["server"] = {"version": server.version(), "port": server.port,
                                      "settings": "Debian defaults (fsync on), trust auth"}
                except Exception as exc:  # noqa: BLE001 - reported, SQLite still runs
                    cell["skipped"] = f"PostgreSQL could not be started: {exc}"
                    print(cell["skipped"], file=sys.stderr, flush=True)
                    continue
                make = server.instance
            else:
                make = sqlite_instance
            for n in sizes:
                row = measure(n, make, workdir, reps=a.reps,
                              apply_reps=a.reps if n <= a.apply_reps_max_shards else 1,
                              variants=variants, rewrite=n <= a.rewrite_max_shards)
                cell["rows"].append(row)
                cell["slopes"] = slopes(cell["rows"])
                cell["ours_under_limit"] = all(r["ours_max_median_s"] < OUR_TICK_LIMIT_S
                                               for r in cell["rows"])
                print(json.dumps({"storage": storage, **{k: row[k] for k in ("shards",)},
                                  **{p: round(row[p]["median_s"], 3)
                                     for p in parts(variants) if row.get(p)}}),
                      flush=True)
                res["total_s"] = time.perf_counter() - start
                _write(out, res)
        res["browser"] = {"skipped": BROWSER_SKIPPED}
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    res["machine"]["loadavg_end"] = loadavg()
    res["total_s"] = time.perf_counter() - start
    if a.also:
        earlier = json.loads(Path(a.also).read_text())
        for storage, cell in earlier["storages"].items():
            if storage not in res["storages"] and not cell.get("skipped"):
                res["storages"][storage] = {**cell, "from": earlier["command"],
                                            "machine": earlier["machine"]}
        res["storages"] = dict(sorted(res["storages"].items(), key=lambda kv: kv[0] != "sqlite"))
        res["command"] = earlier["command"] + "\n" + res["command"]
    _write(out, res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
