"""What a refresh would launch, before it launches: a dry run with an estimate in GPU-hours.

    python -m datamask_pipeline.plan [--json | --keys] [--limit N]

Dagster's automation (``datamask_pipeline/automation.py``) decides what runs; this command
only reads, and plans the steps that automation's scope (``DATAMASK_AUTOMATION``) launches:
``features`` alone under ``corpus`` (the default), ``features`` → ``mask`` →
``selected_subset`` under ``per_shard``. It lists every registered shard whose last automated
step is missing or out of date, with the reason (first found wins):

1. no materialization of the last step (missing), or an upstream step never materialized;
2. an upstream output is newer than what was built from it (``features`` after ``mask``,
   ``mask`` after ``selected_subset``);
3. the code version recorded on a materialization differs from the code's current
   ``code_version`` (what the scheduled refresh picks up; off until ``DATAMASK_REFRESH_CRON``
   is set, so that a code change never launches every shard silently);
4. the raw file is newer than the latest ingestion (the raw-shard sensor records it and
   automation launches it), or the selected parquet file is gone.

A shard whose blocking checks on ``features`` failed is not among them: automation does not
launch its steps after ``features`` (``all_deps_blocking_checks_passed``) until its raw file
changes (reason 4) or ``features``' code version does, so it is listed apart as blocked, with
the failed checks, and not priced. A shard that a run or a requested backfill already has
(:func:`in_progress`) is not listed either: it is shown as in progress.

``--launch`` launches exactly the shards it lists, as ONE asset backfill of the scope's steps
(Dagster's own backfill, what the UI's "Materialize" of several partitions creates; the daemon
runs it, paced by the run queue and the ``gpu`` pool); with nothing listed it launches nothing.
``--keys`` prints the same shards comma-separated; with none it prints nothing and exits 1,
because an empty ``dagster job backfill --partitions ""`` would backfill EVERY shard.

It then estimates the cost of running them: rows per shard from the latest ``features``
materialization (for never-ingested shards, the raw file's bytes times the median rows per
raw byte of ingested ones) and seconds per row from this instance's own ``mask``
materializations (median ``step_wall_time_s`` / rows). With no mask run yet, the time is
reported as unknown rather than guessed.

The corpus selection is planned apart (:func:`corpus_plan`): it is due when shards were
ingested after the last ``corpus_selection`` or are gone (or none ran yet and shards passed
their checks); it waits while a shard is in progress. The dry run says what it would launch, its
cost, scaled by rows from the last corpus run's time, and when the corpus schedule
(``DATAMASK_CORPUS_CRON``, :mod:`datamask_pipeline.schedules`) next fires: the schedule launches
it on that tick under the same rule.

The scan is batched: a few event-log queries per asset and one listing per location, whatever
the number of shards (``bench/orchestration.py`` measures it up to 10,000 shards).
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import asdict, dataclass, field

import dagster as dg
from dagster._core.execution.backfill import BulkActionsFilter, BulkActionStatus, PartitionBackfill
from dagster._core.storage.partition_status_cache import AssetPartitionStatus
from dagster._core.utils import make_new_backfill_id

from assets.ingest import features
from assets.learn import mask
from assets.partitions import PARTITIONS_NAME, scan_raw
from assets.select import selected_subset
from assets.validate import latest_check_status
from datamask_pipeline import automation
from datamask_pipeline.engine import storage
from resources.storage import DataRoot

CHAIN = (features, mask, selected_subset)
# the steps each automation scope launches for a shard (automation.AUTOMATED, without the
# report, which nothing downstream waits for)
CHAINS = {"corpus": (features,), "per_shard": CHAIN}
ID_CHUNK = 1000  # storage ids per event-log query


def _latest_records(instance: dg.DagsterInstance, asset_key: dg.AssetKey, keys) -> dict:
    """{partition: latest materialization record} for ``keys``: one query for the latest
    storage ids of every partition, then the records by storage id in chunks."""
    ids = instance.get_latest_storage_id_by_partition(
        asset_key, dg.DagsterEventType.ASSET_MATERIALIZATION, set(keys))
    wanted = sorted(ids.values())
    out = {}
    for s in range(0, len(wanted), ID_CHUNK):
        chunk = wanted[s : s + ID_CHUNK]
        recs = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=asset_key, storage_ids=chunk), limit=len(chunk)).records
        for rec in recs:
            out[rec.partition_key] = rec
    return out


def _selected_files(data_root: DataRoot) -> set:
    """Partition keys with a selected parquet file, from one listing."""
    try:
        uris = storage.list_files(data_root.selected_root, suffix=".parquet")
    except storage.StorageError:  # not created yet: nothing there
        return set()
    return {storage.partition_key_for(u) for u in uris}


def _code_version(asset_def) -> str | None:
    return asset_def.code_versions_by_key[asset_def.key]


def _meta(rec, name):
    entry = rec.asset_materialization.metadata.get(name) if rec is not None else None
    return None if entry is None else entry.value


# backfills that may still launch runs (REQUESTED: the daemon works through it)
ACTIVE_BACKFILLS = [BulkActionStatus.REQUESTED]
LAUNCH_TAG = "datamask/launched_by"


def _backfill_targets(backfill, asset_keys) -> set:
    """The partitions of ``asset_keys`` that ``backfill`` targets and has not finished
    (an asset backfill: its target minus what it materialized or failed; a job backfill: its
    partition names)."""
    data = backfill.asset_backfill_data
    if data is None:
        return set(backfill.partition_names or [])
    out = set()
    for key in asset_keys:
        target = data.target_subset.partitions_subsets_by_asset_key.get(key)
        if target is None:
            continue
        done = set()
        for sub in (data.materialized_subset, data.failed_and_downstream_subset):
            got = sub.partitions_subsets_by_asset_key.get(key)
            if got is not None:
                done |= set(got.get_partition_keys())
        out |= set(target.get_partition_keys()) - done
    return out


def in_progress(instance: dg.DagsterInstance, keys, assets=(features,)) -> dict:
    """{shard: what has it} for the shards of ``keys`` that are in progress for any of
    ``assets``: a run that planned them and has not ended (Dagster's partition status
    IN_PROGRESS: queued or running), or a requested backfill that targets them and has not
    materialized them yet (queued before its runs exist). One status lookup per asset and one
    query of the active backfills, whatever the number of shards."""
    keys = list(keys)
    out = {}
    for a in assets:
        status = instance.get_status_by_partition(a.key, keys, a.partitions_def) or {}
        for key, st in status.items():
            if st == AssetPartitionStatus.IN_PROGRESS:
                out.setdefault(key, f"a run of {a.key.to_user_string()} is queued or running")
    wanted = set(keys)
    for b in instance.get_backfills(filters=BulkActionsFilter(statuses=ACTIVE_BACKFILLS)):
        for key in sorted(_backfill_targets(b, [a.key for a in assets]) & wanted):
            out.setdefault(key, f"backfill {b.backfill_id} has it ({b.status.value})")
    return out


@dataclass
class Plan:
    """The shards a refresh would run, why, and what that would cost."""

    registered: int
    reasons: dict  # key -> reason
    blocked: dict = field(default_factory=dict)  # key -> failed blocking checks (not launched)
    in_progress: dict = field(default_factory=dict)  # key -> the run or backfill that has it
    rows: dict = field(default_factory=dict)  # key -> rows (measured or estimated)
    rows_estimated: list = field(default_factory=list)  # keys whose rows are estimated
    seconds_per_row: float | None = None  # median over this instance's mask runs
    mask_runs_measured: int = 0
    scope: str = "per_shard"  # automation's scope this plan follows

    @property
    def total_rows(self) -> int:
        return int(sum(self.rows.get(k, 0) for k in self.reasons))

    @property
    def gpu_hours(self) -> float | None:
        if self.scope != "per_shard" or self.seconds_per_row is None:
            return None
        return self.total_rows * self.seconds_per_row / 3600.0

    def as_dict(self) -> dict:
        out = asdict(self)
        out.update(to_run=len(self.reasons), total_rows=self.total_rows, gpu_hours=self.gpu_hours)
        return out


_MISSING = {"features": "missing: no features yet",
            "selected_subset": "missing: no selected subset yet"}
_AFTER = {("features", "mask"): "stale: features were re-materialized after the mask",
          ("mask", "selected_subset"):
              "stale: the mask was re-materialized after the selected subset"}


def raw_files(data_root: DataRoot) -> dict:
    """{key: (size, mtime_ns)} of the raw location's shards, from one listing ({} when the
    location does not exist yet)."""
    try:
        return scan_raw(data_root.raw_root).files
    except storage.StorageError:
        return {}


def stale_reasons(instance: dg.DagsterInstance, keys, data_root: DataRoot,
                  records: dict | None = None, chain=CHAIN, raw: dict | None = None) -> dict:
    """{key: why the shard needs a run of ``chain``} for every shard of ``keys`` that does
    (up-to-date ones are left out). Three event-log queries per asset (not per shard) and one
    listing each of the raw and the selected location, whatever the number of shards."""
    keys = list(keys)
    recs = records or {a.key: _latest_records(instance, a.key, keys) for a in chain}
    raw = raw_files(data_root) if raw is None else raw
    selected = _selected_files(data_root) if selected_subset in chain else None
    current = {a.key: _code_version(a) for a in chain}
    names = [a.key.to_user_string() for a in chain]
    out = {}
    for key in keys:
        got = [recs[a.key].get(key) for a in chain]
        feats = got[0]
        if got[-1] is None:
            out[key] = _MISSING[names[-1]]
        elif any(r is None for r in got):
            out[key] = "missing: an upstream step was never materialized"
        elif after := next((_AFTER[(names[i], names[i + 1])] for i in range(len(got) - 1)
                            if got[i].storage_id > got[i + 1].storage_id), None):
            out[key] = after
        else:
            reason = None
            for asset_def, rec in zip(chain, got):
                got = rec.asset_materialization.tags.get("dagster/code_version")
                if got != current[asset_def.key]:
                    reason = (f"stale: code version of {asset_def.key.to_user_string()} changed "
                              f"({got} -> {current[asset_def.key]})")
                    break
            if reason is None and key in raw and raw[key][1] / 1e9 > feats.timestamp:
                reason = "stale: the raw shard was modified after ingestion"
            if reason is None and selected is not None and key not in selected:
                reason = "missing: the selected parquet file is gone"
            if reason is not None:
                out[key] = reason
    return out


def blocked_by_checks(instance: dg.DagsterInstance, keys, features_records: dict,
                      raw: dict) -> dict:
    """{key: failed check names} for the shards of ``keys`` whose latest blocking check result
    on ``features`` failed and whose ``features`` automation would not request again (its raw
    file is not newer than the ingestion, its code version did not change), so automation will
    not launch their later steps. One query per check, whatever the number of shards."""
    keys = [k for k in keys if k in features_records]
    status = latest_check_status(instance, keys) if keys else {}
    current = _code_version(features)
    out = {}
    for key in keys:
        failed = sorted(name for name, st in status.get(key, {}).items() if st == "FAILED")
        rec = features_records[key]
        relaunched = ((key in raw and raw[key][1] / 1e9 > rec.timestamp)
                      or rec.asset_materialization.tags.get("dagster/code_version") != current)
        if failed and not relaunched:
            out[key] = failed
    return out


def plan(instance: dg.DagsterInstance, data_root: DataRoot, scope: str | None = None,
         raw: dict | None = None, records: dict | None = None) -> Plan:
    """The dry run: what automation's ``scope`` (default: ``DATAMASK_AUTOMATION``) would run
    and what it would cost (see the module doc). ``raw`` (:func:`raw_files`) and ``records``
    ({asset key: latest records}) may be passed in by a caller that has them already."""
    scope = scope or automation.env_scope()
    keys = sorted(instance.get_dynamic_partitions(PARTITIONS_NAME))
    recs = dict(records or {})
    # the scope's steps, and mask for the measured seconds per row
    for a in dict.fromkeys((*CHAINS[scope], mask)):
        if a.key not in recs:
            recs[a.key] = _latest_records(instance, a.key, keys)
    raw = raw_files(data_root) if raw is None else raw
    reasons = stale_reasons(instance, keys, data_root, records=recs, chain=CHAINS[scope],
                            raw=raw)
    # every ingested shard (not only those listed): under the corpus scope a shard whose checks
    # failed has its features and is listed nowhere else, yet the corpus selection leaves it out
    blocked = blocked_by_checks(instance, keys, recs[features.key], raw)
    busy = in_progress(instance, keys, CHAINS[scope])
    reasons = {k: r for k, r in reasons.items() if k not in blocked and k not in busy}
    out = Plan(registered=len(keys), reasons=reasons, blocked=blocked, scope=scope,
               in_progress=busy)

    rows = {k: _meta(r, "dagster/row_count") for k, r in recs[features.key].items()}
    rows = {k: int(v) for k, v in rows.items() if v is not None}
    per_byte = [rows[k] / raw[k][0] for k in rows if k in raw and raw[k][0]]
    ratio = statistics.median(per_byte) if per_byte else None
    for key in reasons:
        if key not in rows and key in raw and ratio is not None:
            rows[key] = int(round(raw[key][0] * ratio))
            out.rows_estimated.append(key)
    out.rows = {k: rows[k] for k in reasons if k in rows}

    rates = []
    for key, rec in recs[mask.key].items():
        wall, n = _meta(rec, "step_wall_time_s"), _meta(rec, "dagster/row_count")
        if wall is not None and n:
            rates.append(float(wall) / int(n))
    out.mask_runs_measured = len(rates)
    out.seconds_per_row = statistics.median(rates) if rates else None
    return out


CORPUS_KEY = dg.AssetKey("corpus_selection")
CORPUS_JOB = "corpus_job"


def corpus_plan(instance: dg.DagsterInstance, data_root: DataRoot, features_records: dict | None = None,
                raw: dict | None = None, busy: dict | None = None) -> dict:
    """Whether the corpus selection is due, what it would launch and what it would cost: the
    shards whose features are newer than the last ``corpus_selection`` (new or rewritten), the
    shards it covered that are gone, and the cost scaled by rows from that run's own time
    (``seconds`` metadata). It waits (``due`` false, ``waiting`` true) while a shard is in
    progress (:func:`in_progress` of ``features``; ``busy`` may be passed in) or a corpus
    selection is running. It never launches: the corpus schedule (``schedules.py``) applies the
    same rule at its cron tick, or you launch ``corpus_job``.

    ``state`` says which case holds: ``no shards`` (nothing registered), ``no input`` (no
    registered shard has features that passed their checks), ``first`` (none ran yet),
    ``changed``, ``up to date``; ``waiting`` is set apart."""
    keys = sorted(instance.get_dynamic_partitions(PARTITIONS_NAME))
    if features_records is None:
        features_records = _latest_records(instance, features.key, keys)
    raw = raw_files(data_root) if raw is None else raw
    busy = in_progress(instance, keys) if busy is None else busy
    last = instance.fetch_materializations(CORPUS_KEY, limit=1).records
    status = latest_check_status(instance, list(features_records))
    passed = {k for k in features_records
              if all(v == "SUCCEEDED" for v in status.get(k, {}).values())}
    present = sorted(k for k in passed if k in raw and k not in busy)
    failing = sorted(k for k in features_records if k not in passed and k not in busy)
    rows_now = sum(int(_meta(features_records[k], "dagster/row_count") or 0) for k in present)
    running = _corpus_running(instance)
    out = {"launches": "corpus_job (corpus_dedup -> corpus_selection -> corpus_subset)",
           "shards": len(present), "registered": len(keys),
           "rows": rows_now, "due": False, "waiting": False, "state": "up to date",
           "reasons": [], "changed": [], "removed": [], "failing": failing,
           "in_progress": dict(sorted(busy.items())), "corpus_running": running,
           "last_selection": None, "estimated_seconds": None}
    if not last:
        out["state"] = "first" if present else ("no shards" if not keys else "no input")
        out["due"] = bool(present)
        out["reasons"] = ["no corpus selection yet"] if present else []
    else:
        rec = last[0]
        out["last_selection"] = rec.timestamp
        covered, last_sel = set(), {}
        try:
            # the shards it selected from, and left out
            last_sel = json.loads(storage.read_bytes(storage.join(data_root.corpus_dir(),
                                                                  "selection.json")))
            covered = set(last_sel.get("sizes", {})) | set(last_sel.get("excluded", {}))
        except (OSError, ValueError):
            pass
        changed = [k for k in present if features_records[k].timestamp > rec.timestamp
                   or (covered and k not in covered)]
        # gone: covered then, and now unregistered or without its raw file; a shard in progress
        # or failing its checks now is not gone (it is listed as what it is)
        removed = sorted(k for k in covered - set(last_sel.get("excluded", {}))
                         if k not in busy and k not in failing and k not in present)
        # nothing left to select from: not due (the run would fail), said so
        out.update(changed=changed, removed=removed, due=bool(present and (changed or removed)),
                   state=("no input" if not present and not busy else
                          "changed" if changed or removed else "up to date"))
        if changed:
            out["reasons"].append(f"{len(changed)} shard(s) new or re-ingested since the last "
                                  "corpus selection")
        if removed:
            out["reasons"].append(f"{len(removed)} shard(s) of the last selection are gone")
        secs, rows_then = _meta(rec, "seconds"), _meta(rec, "rows_corpus")
        if secs is not None and rows_then:
            out["estimated_seconds"] = float(secs) * rows_now / int(rows_then)
    if busy or running:
        # the schedule does not launch while a shard or a corpus selection is in progress
        out["waiting"] = True
        out["due"] = False
    return out


def _corpus_running(instance: dg.DagsterInstance) -> list:
    """Run ids of the corpus selections queued or running (a ``corpus_job`` run, or any run
    that selected ``corpus_selection``, that has not ended)."""
    records = instance.get_run_records(dg.RunsFilter(
        statuses=[dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED,
                  dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED]))
    return [r.dagster_run.run_id for r in records
            if r.dagster_run.job_name == CORPUS_JOB
            or CORPUS_KEY in (r.dagster_run.asset_selection or ())]


def render_corpus(c: dict, limit: int = 20, schedule: str | None = None) -> str:
    """The corpus plan in words; ``schedule``: the schedule's line (:func:`schedule_line`)."""
    state = c.get("state")
    if state == "no shards":
        lines = ["corpus selection: nothing to select from: no shard is registered (register "
                 "shards: python -m datamask_pipeline.register, or the raw-shard sensor)"]
    elif c["waiting"]:
        busy, what = c["in_progress"], []
        if busy:
            what.append(f"{len(busy)} shard(s) in progress")
        if c["corpus_running"]:
            what.append(f"a corpus selection is running ({', '.join(c['corpus_running'][:3])})")
        lines = [f"corpus selection waits: {' and '.join(what)}; not launched until they end"]
        if c["reasons"]:
            lines.append(f"  then due: {'; '.join(c['reasons'])}")
        for key in list(busy)[:limit]:
            lines.append(f"  in progress: {key} ({busy[key]})")
        if len(busy) > limit:
            lines.append(f"  ... and {len(busy) - limit} more in progress (--json)")
    elif state == "no input":
        when = "" if c.get("last_selection") is None else " now"
        lines = [f"corpus selection: {'none yet, and ' if not when else 'not launched: '}none "
                 f"of the {c['registered']} registered shard(s){when} has features that passed "
                 "their checks (materialize features first)"]
        if c["reasons"]:
            lines.append(f"  since the last corpus selection: {'; '.join(c['reasons'])}")
    elif c["due"]:
        lines = [f"corpus selection due: {'; '.join(c['reasons'])}",
                 f"  launches {c['launches']} over {c['shards']} shard(s), {c['rows']:,} rows"]
    else:
        lines = ["corpus selection: up to date (no shard new, re-ingested or removed since the "
                 "last corpus_selection)"]
    for key in c["changed"][:limit]:
        lines.append(f"  changed: {key}")
    for key in c["removed"][:limit]:
        lines.append(f"  removed: {key}")
    if c.get("failing"):
        lines.append(f"  left out: {len(c['failing'])} shard(s) whose checks failed: "
                     f"{', '.join(c['failing'][:limit])}")
    if c["due"] or (c["waiting"] and c["reasons"]):
        if c["estimated_seconds"] is None:
            lines.append("  estimated cost: unknown (no corpus selection on this instance to "
                         "scale from)")
        else:
            lines.append(f"  estimated cost: {c['estimated_seconds']:.3g} s (the last corpus "
                         "selection's time, scaled by rows); every shard's share may change")
    if schedule:
        lines.append(f"  {schedule}")
    return "\n".join(lines)


def render(p: Plan, limit: int = 20) -> str:
    steps = " -> ".join(a.key.to_user_string() for a in CHAINS[p.scope])
    lines = [f"{len(p.reasons)} of {p.registered} registered shard(s) need a run of {steps} "
             f"(automation scope {p.scope}, DATAMASK_AUTOMATION)"]
    for key in sorted(p.reasons)[:limit]:
        rows = p.rows.get(key)
        est = " (estimated)" if key in p.rows_estimated else ""
        lines.append(f"  {key}: {p.reasons[key]}; rows {rows if rows is not None else '?'}{est}")
    if len(p.reasons) > limit:
        lines.append(f"  ... and {len(p.reasons) - limit} more (--limit, --json)")
    if p.in_progress:
        lines.append(f"{len(p.in_progress)} shard(s) in progress (not listed: a run or a "
                     "backfill already has them)")
        for key in sorted(p.in_progress)[:limit]:
            lines.append(f"  {key}: {p.in_progress[key]}")
        if len(p.in_progress) > limit:
            lines.append(f"  ... and {len(p.in_progress) - limit} more (--limit, --json)")
    if p.blocked:
        lines.append(f"{len(p.blocked)} shard(s) blocked by failed blocking checks on features "
                     "(not launched by automation, not priced; fix the raw file: its new version "
                     "relaunches the shard)")
        for key in sorted(p.blocked)[:limit]:
            lines.append(f"  {key}: failed {', '.join(p.blocked[key])}")
        if len(p.blocked) > limit:
            lines.append(f"  ... and {len(p.blocked) - limit} more (--limit, --json)")
    if p.scope != "per_shard":
        lines.append(f"estimated cost: features of {p.total_rows:,} rows (CPU: embeddings and "
                     "quality where missing, and the checks); no device-hours: the selection is "
                     "the corpus stage's, planned below")
    elif p.gpu_hours is None:
        lines.append(f"estimated cost: unknown ({p.total_rows:,} rows known; no mask run on this "
                     "instance to measure seconds per row yet)")
    else:
        lines.append(f"estimated cost: {p.gpu_hours:.3g} device-hours for {p.total_rows:,} rows "
                     f"at {p.seconds_per_row:.3g} s/row (median of {p.mask_runs_measured} mask "
                     "run(s) on this instance)")
    return "\n".join(lines)


def launch(instance: dg.DagsterInstance, p: Plan, asset_graph) -> str | None:
    """Launch exactly the shards ``p`` lists (``p.reasons``) as ONE asset backfill of the
    scope's steps (``CHAINS[p.scope]``, their blocking checks with them), with Dagster's own
    backfill API (what the UI's launch of several partitions creates; the daemon runs it).
    Returns the backfill id, or None, launching nothing, when no shard is listed."""
    keys = sorted(p.reasons)
    if not keys:
        return None
    steps = [a.key for a in CHAINS[p.scope]]
    backfill = PartitionBackfill.from_asset_partitions(
        backfill_id=make_new_backfill_id(),
        asset_graph=asset_graph,
        partition_names=keys,
        asset_selection=steps,
        backfill_timestamp=time.time(),
        tags={LAUNCH_TAG: "plan"},
        dynamic_partitions_store=instance,
        all_partitions=False,
        title=f"dry run: {len(keys)} shard(s)",
        description=f"{' -> '.join(k.to_user_string() for k in steps)} of the shard(s) "
                    "python -m datamask_pipeline.plan listed",
        run_config=None,
    )
    instance.add_backfill(backfill)
    return backfill.backfill_id
