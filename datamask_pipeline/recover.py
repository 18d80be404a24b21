"""Recover from run workers that were killed (SIGKILL, the OOM killer, a reboot) on this machine.

    python -m datamask_pipeline.recover [--dry-run]

A run worker that is killed cannot report anything: its run stays STARTED forever and keeps
the concurrency slot it claimed, so with the ``gpu`` pool (limit 1 in dagster.yaml) every later
mask step waits for that slot, forever. On Kubernetes, Dagster's run monitoring notices dead
workers; the local run launcher (``dagster dev``, ``dagster asset materialize``) has no such
health check. This command looks at every run of ``$DAGSTER_HOME`` that is STARTING, STARTED or
CANCELING, finds the process that last wrote an event for it, and when that process no longer
exists on this machine (or its pid now belongs to a younger process) it marks the run FAILED and
frees its concurrency slots. A run retry (the instance's ``run_retries`` in dagster.yaml, executed
by the daemon of ``dagster dev``) or a re-execution then resumes the mask from its checkpoint.

Only for instances whose runs execute on this machine. Exit code 0; prints one line per run
recovered (``--dry-run``: per run that would be).
"""

from __future__ import annotations

import argparse
import os
import time

ACTIVE = ("STARTING", "STARTED", "CANCELING")


def _boot_time() -> float | None:
    try:
        with open("/proc/stat") as fh:
            for line in fh:
                if line.startswith("btime "):
                    return float(line.split()[1])
    except OSError:
        return None
    return None


def process_alive(pid: int, since: float | None = None) -> bool:
    """True when ``pid`` is a live (not zombie) process that already existed at ``since`` (a
    unix time; a younger process means the pid was reused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return True  # no /proc: trust kill(0)
    if fields[0] in ("Z", "X"):
        return False
    boot = _boot_time()
    if since is not None and boot is not None:
        started = boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")
        if started > since + 1.0:
            return False
    return True


def last_worker(instance, run_id: str):
    """(pid, timestamp) of the latest event of the run that carries a process id."""
    for entry in reversed(instance.all_logs(run_id)):
        ev = entry.dagster_event
        if ev is not None and ev.pid is not None:
            return int(ev.pid), float(entry.timestamp)
    return None, None


def dead_runs(instance) -> list:
    """[(run, pid, reason)] of active runs whose worker process is gone."""
    import dagster as dg

    statuses = [getattr(dg.DagsterRunStatus, s) for s in ACTIVE]
    out = []
    for run in instance.get_runs(filters=dg.RunsFilter(statuses=statuses)):
        pid, ts = last_worker(instance, run.run_id)
        if pid is None:
            continue  # not started by a worker yet (queued / launching): leave it
        if not process_alive(pid, since=ts):
            out.append((run, pid, f"run worker process {pid} no longer exists"))
    return out


def recover(instance, dry_run: bool = False) -> list:
    """Mark runs with dead workers FAILED and free their concurrency slots. Returns
    ``[(run_id, pid, reason)]``."""
    done = []
    for run, pid, reason in dead_runs(instance):
        if not dry_run:
            instance.report_run_failed(
                run, f"{reason} (killed?); marked failed by datamask_pipeline.recover at "
                     f"{time.strftime('%Y-%m-%d %H:%M:%S')}")
            storage = instance.event_log_storage
            if storage.supports_global_concurrency_limits:
                storage.free_concurrency_slots_for_run(run.run_id)
        done.append((run.run_id, pid, reason))
    return done


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m datamask_pipeline.recover",
                                description="Mark runs whose worker process was killed as failed "
                                            "and free their concurrency slots.")
    p.add_argument("--dry-run", action="store_true", help="only list the runs")
    args = p.parse_args(argv)

    from datamask_pipeline import settings

    settings.ensure_dagster_home()
    import dagster as dg

    with dg.DagsterInstance.get() as instance:
        done = recover(instance, dry_run=args.dry_run)
    verb = "would mark" if args.dry_run else "marked"
    for run_id, pid, reason in done:
        print(f"{verb} run {run_id} failed: {reason}")
    print(f"{len(done)} run(s) with a dead worker")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
