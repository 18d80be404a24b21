"""Register raw shards as partitions without the daemon (what the sensor does on each tick).

    python -m datamask_pipeline.register [--raw URI]

Uses the Dagster instance in ``$DAGSTER_HOME`` (default ``<repo>/.dagster_home``, created with
the repository's dagster.yaml when missing) and the raw location ``--raw``, else env
``DATAMASK_RAW_ROOT``, else ``<data root>/raw``. Prints the added and already known keys; files
whose names cannot be partition keys are listed and skipped (exit code 1 if there were any).
"""

import argparse
import sys


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m datamask_pipeline.register",
                                description="Register raw parquet shards as partitions of 'shards'.")
    p.add_argument("--raw", default=None, help="raw location (path or URI); default env "
                   "DATAMASK_RAW_ROOT, else <data root>/raw. It must be the location the code "
                   "location reads (the same DATAMASK_RAW_ROOT / DATAMASK_DATA_ROOT)")
    args = p.parse_args(argv)

    from datamask_pipeline import settings

    home = settings.ensure_dagster_home()
    import dagster as dg

    from assets.partitions import register_shards
    from datamask_pipeline.engine.storage import StorageError

    raw = args.raw or settings.raw_root()
    instance = dg.DagsterInstance.get()
    try:
        out = register_shards(instance, raw)
    except StorageError as exc:
        print(f"register: error: {exc}", file=sys.stderr)
        return 2
    print(f"DAGSTER_HOME={home}")
    print(f"raw location: {raw}")
    print(f"added {len(out['added'])} partition(s): {', '.join(out['added']) or '-'}")
    print(f"already registered: {len(out['existing'])}")
    for uri, reason in out["invalid"]:
        print(f"skipped {uri}: {reason}", file=sys.stderr)
    return 1 if out["invalid"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
