"""``python -m datamask_pipeline.plan``: the dry run's command line (the plan itself is
:mod:`datamask_pipeline.plan`; this module adds what a command needs: the instance, the
Definitions' asset graph for ``--launch`` and the corpus schedule's next tick)."""

from __future__ import annotations

import argparse
import json
import sys

import dagster as dg

from assets.ingest import features
from assets.partitions import PARTITIONS_NAME
from resources.storage import DataRoot

from . import (CHAINS, _latest_records, corpus_plan, launch, plan, raw_files, render,
               render_corpus)


def schedule_line(instance: dg.DagsterInstance, now: float | None = None) -> str:
    """When the corpus schedule next fires, or why it does not (off, stopped in the UI)."""
    from datamask_pipeline import schedules

    return schedules.describe(instance, now=now)


def main(argv=None, instance: dg.DagsterInstance | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m datamask_pipeline.plan",
                                 description="Dry run: the shards a refresh would launch, why, "
                                 "and an estimate of the device-hours; whether the corpus "
                                 "selection is due and when its schedule fires. Launches nothing "
                                 "unless --launch.")
    out_fmt = ap.add_mutually_exclusive_group()
    out_fmt.add_argument("--json", action="store_true", help="print the plan as JSON")
    out_fmt.add_argument("--keys", action="store_true",
                         help="print only the shards that need a run, comma-separated; with "
                         "none, print nothing and exit 1 (an empty `dagster job backfill "
                         "--partitions \"\"` would backfill every shard)")
    out_fmt.add_argument("--launch", action="store_true",
                         help="launch exactly the shards listed, as one backfill of the "
                         "automation scope's steps (run by the daemon); none listed: nothing")
    ap.add_argument("--limit", type=int, default=20, help="shards listed in the text output")
    args = ap.parse_args(argv)

    from datamask_pipeline import settings

    if instance is None:
        settings.ensure_dagster_home()
        instance = dg.DagsterInstance.get()
    data_root = DataRoot(root=settings.data_root(), raw=settings.raw_root())
    # one raw listing and one query of the features' records serve both plans
    raw = raw_files(data_root)
    keys = sorted(instance.get_dynamic_partitions(PARTITIONS_NAME))
    feats = _latest_records(instance, features.key, keys)
    p = plan(instance, data_root, raw=raw, records={features.key: feats})
    if args.keys:
        if not p.reasons:
            print("nothing to run: no shard is listed (an empty --partitions would backfill "
                  "every shard; nothing printed)", file=sys.stderr)
            return 1
        print(",".join(sorted(p.reasons)))
        return 0
    if args.launch:
        print(render(p, args.limit))
        from datamask_pipeline.definitions import defs

        backfill_id = launch(instance, p, defs.resolve_asset_graph())
        if backfill_id is None:
            print("launched nothing: no shard needs a run")
        else:
            print(f"launched backfill {backfill_id}: {len(p.reasons)} shard(s) of "
                  f"{' -> '.join(a.key.to_user_string() for a in CHAINS[p.scope])} (the "
                  "daemon runs it: dagster dev, or dagster-daemon run; UI: Overview > "
                  "Backfills)")
        print("the corpus selection is not launched here: its schedule or "
              "`dagster job launch -j corpus_job`")
        return 0
    busy = {**p.in_progress} if p.scope == "corpus" else None
    c = corpus_plan(instance, data_root, features_records=feats, raw=raw, busy=busy)
    sched = schedule_line(instance)
    if args.json:
        print(json.dumps({**p.as_dict(), "corpus": {**c, "schedule": sched}}, indent=2,
                         sort_keys=True))
    else:
        print(render(p, args.limit) + "\n" + render_corpus(c, args.limit, schedule=sched))
    return 0
