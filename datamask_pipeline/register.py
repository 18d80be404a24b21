"""Register raw shards as partitions without the daemon (what the sensor does on each tick).

    python -m datamask_pipeline.register [--raw URI]

Uses the Dagster instance in ``$DAGSTER_HOME`` (default ``<repo>/.dagster_home``, created with
the repository's dagster.yaml when missing; ``open_instance``, which the demo uses too) and the
raw location ``--raw``, else env ``DATAMASK_RAW_ROOT``, else ``<data root>/raw``. Prints the
added and already known keys; files whose names cannot be partition keys are listed and skipped
(exit code 1 if there were any). A raw location or a ``DAGSTER_HOME`` that cannot be used is
one line with the fix (exit code 2).
"""

import os
import sys

from datamask_pipeline.engine.cli_flags import CommandLine


class InstanceError(RuntimeError):
    """``$DAGSTER_HOME`` cannot be created or opened (the message is one line with the fix)."""


def open_instance():
    """``(DAGSTER_HOME, the instance)``: ``$DAGSTER_HOME``, default ``<repo>/.dagster_home``,
    created with the repository's dagster.yaml when missing. Raises InstanceError when it
    cannot be created or opened."""
    from datamask_pipeline import settings

    try:
        home = settings.ensure_dagster_home()
    except OSError as exc:
        path = os.environ.get("DAGSTER_HOME")
        why = ("a file, not a folder" if path and os.path.isfile(path) else
               f"cannot create it ({exc.strerror or exc})")
        raise InstanceError(
            f"DAGSTER_HOME={path}: {why}; export DAGSTER_HOME=<a writable folder>, or unset it to "
            f"use {settings.repo_root() / '.dagster_home'}") from None
    import dagster as dg

    try:
        return home, dg.DagsterInstance.get()
    except Exception as exc:  # noqa: BLE001 - whatever stops the instance opening: one line
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InstanceError(f"DAGSTER_HOME={home}: cannot open the Dagster instance ({first}); "
                            f"fix {os.path.join(home, 'dagster.yaml')} or point DAGSTER_HOME "
                            "at another folder") from None


def main(argv=None) -> int:
    p = CommandLine("datamask_pipeline.register",
                    description="Register raw parquet shards as partitions of 'shards'.")
    p.add_argument("--raw", default=None, help="raw location (path or URI); default env "
                   "DATAMASK_RAW_ROOT, else <data root>/raw. It must be the location the code "
                   "location reads (the same DATAMASK_RAW_ROOT / DATAMASK_DATA_ROOT)")
    args = p.parse_args(argv)

    from datamask_pipeline import settings

    try:
        home, instance = open_instance()
    except InstanceError as exc:
        p.fail(str(exc))
    from assets.partitions import register_shards
    from datamask_pipeline.engine.storage import StorageError

    raw = args.raw or settings.raw_root()
    try:
        out = register_shards(instance, raw)
    except StorageError as exc:
        p.fail(f"{exc}; put the raw *.parquet shards there, or name their folder with --raw "
               f"(or {settings.ENV_RAW_ROOT} / {settings.ENV_DATA_ROOT})")
    print(f"DAGSTER_HOME={home}")
    print(f"raw location: {raw}")
    print(f"added {len(out['added'])} partition(s): {', '.join(out['added']) or '-'}")
    print(f"already registered: {len(out['existing'])}")
    for uri, reason in out["invalid"]:
        print(f"skipped {uri}: {reason}", file=sys.stderr)
    return 1 if out["invalid"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
