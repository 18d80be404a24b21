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
the failed checks, and not priced. ``--keys`` prints the shards that need a run, comma-separated,
for ``dagster job backfill --partitions`` (README: "Re-run many shards").

It then estimates the cost of running them: rows per shard from the latest ``features``
materialization (for never-ingested shards, the raw file's bytes times the median rows per
raw byte of ingested ones) and seconds per row from this instance's own ``mask``
materializations (median ``step_wall_time_s`` / rows). With no mask run yet, the time is
reported as unknown rather than guessed.

The corpus selection is planned apart (:func:`corpus_plan`): it is due when shards were
ingested after the last ``corpus_selection`` or are gone; the dry run says what it would launch
and its cost, scaled by rows from the last corpus run's time.

The scan is batched: a few event-log queries per asset and one listing per location, whatever
the number of shards (``bench/orchestration.py`` measures it up to 10,000 shards).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass, field

import dagster as dg

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


@dataclass
class Plan:
    """The shards a refresh would run, why, and what that would cost."""

    registered: int
    reasons: dict  # key -> reason
    blocked: dict = field(default_factory=dict)  # key -> failed blocking checks (not launched)
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
    reasons = {k: r for k, r in reasons.items() if k not in blocked}
    out = Plan(registered=len(keys), reasons=reasons, blocked=blocked, scope=scope)

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


def corpus_plan(instance: dg.DagsterInstance, data_root: DataRoot, features_records: dict | None = None,
                raw: dict | None = None) -> dict:
    """Whether the corpus selection is due, what it would launch and what it would cost: the
    shards whose features are newer than the last ``corpus_selection`` (new or rewritten), the
    shards it covered that are gone, and the cost scaled by rows from that run's own time
    (``seconds`` metadata). It never launches: a re-selection is started by hand or by
    ``corpus_job`` (README: Select for the corpus)."""
    keys = sorted(instance.get_dynamic_partitions(PARTITIONS_NAME))
    if features_records is None:
        features_records = _latest_records(instance, features.key, keys)
    raw = raw_files(data_root) if raw is None else raw
    last = instance.fetch_materializations(CORPUS_KEY, limit=1).records
    status = latest_check_status(instance, list(features_records))
    present = sorted(k for k in features_records if k in raw
                     and all(v == "SUCCEEDED" for v in status.get(k, {}).values()))
    rows_now = sum(int(_meta(features_records[k], "dagster/row_count") or 0) for k in present)
    out = {"launches": "corpus_job (corpus_selection -> corpus_subset)", "shards": len(present),
           "rows": rows_now, "due": False, "reasons": [], "changed": [], "removed": [],
           "estimated_seconds": None}
    if not last:
        out["due"] = bool(present)
        out["reasons"] = ["no corpus selection yet"] if present else []
        return out
    rec = last[0]
    covered, last_sel = set(), {}
    try:
        # the shards it selected from, and left out
        last_sel = json.loads(storage.read_bytes(storage.join(data_root.corpus_dir(),
                                                              "selection.json")))
        covered = set(last_sel.get("sizes", {})) | set(last_sel.get("excluded", {}))
    except (OSError, ValueError):
        pass
    changed = [k for k in present
               if features_records[k].timestamp > rec.timestamp or (covered and k not in covered)]
    removed = sorted(covered - set(present) - set(last_sel.get("excluded", {})) if covered else [])
    out.update(changed=changed, removed=removed, due=bool(changed or removed))
    if changed:
        out["reasons"].append(f"{len(changed)} shard(s) new or re-ingested since the last "
                              "corpus selection")
    if removed:
        out["reasons"].append(f"{len(removed)} shard(s) of the last selection are gone")
    secs, rows_then = _meta(rec, "seconds"), _meta(rec, "rows_corpus")
    if secs is not None and rows_then:
        out["estimated_seconds"] = float(secs) * rows_now / int(rows_then)
    return out


def render_corpus(c: dict, limit: int = 20) -> str:
    if not c["due"]:
        return "corpus selection: up to date (nothing new since the last corpus_selection)"
    lines = [f"corpus selection due: {'; '.join(c['reasons'])}",
             f"  launches {c['launches']} over {c['shards']} shard(s), {c['rows']:,} rows"]
    for key in c["changed"][:limit]:
        lines.append(f"  changed: {key}")
    for key in c["removed"][:limit]:
        lines.append(f"  removed: {key}")
    if c["estimated_seconds"] is None:
        lines.append("  estimated cost: unknown (no corpus selection on this instance to scale from)")
    else:
        lines.append(f"  estimated cost: {c['estimated_seconds']:.3g} s (the last corpus selection's "
                     "time, scaled by rows); every shard's share may change")
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m datamask_pipeline.plan",
                                 description="Dry run: the shards a refresh would launch, why, "
                                 "and an estimate of the device-hours. Launches nothing.")
    out_fmt = ap.add_mutually_exclusive_group()
    out_fmt.add_argument("--json", action="store_true", help="print the plan as JSON")
    out_fmt.add_argument("--keys", action="store_true",
                         help="print only the shards that need a run, comma-separated (for "
                         "`dagster job backfill --partitions`)")
    ap.add_argument("--limit", type=int, default=20, help="shards listed in the text output")
    args = ap.parse_args(argv)

    from datamask_pipeline import settings

    settings.ensure_dagster_home()
    instance = dg.DagsterInstance.get()
    data_root = DataRoot(root=settings.data_root(), raw=settings.raw_root())
    # one raw listing and one query of the features' records serve both plans
    raw = raw_files(data_root)
    keys = sorted(instance.get_dynamic_partitions(PARTITIONS_NAME))
    feats = _latest_records(instance, features.key, keys)
    p = plan(instance, data_root, raw=raw, records={features.key: feats})
    if args.keys:
        print(",".join(sorted(p.reasons)))
        return 0
    c = corpus_plan(instance, data_root, features_records=feats, raw=raw)
    if args.json:
        print(json.dumps({**p.as_dict(), "corpus": c}, indent=2, sort_keys=True))
    else:
        print(render(p, args.limit) + "\n" + render_corpus(c, args.limit))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
