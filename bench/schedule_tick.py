"""Cost of one refresh-schedule evaluation against the number of registered shards.

    .venv/bin/python -m bench.schedule_tick --shards 100,1000,5000 [--out DIR]

Registers N shard partitions on a fresh SQLite instance (every shard missing: the worst case
for a naive scan, every shard needs a run) with tiny raw files, then times
``refresh_stale_shards`` evaluations (median of 3). Writes ``results_schedule_tick.json``.
"""

import argparse
import json
import os
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

import dagster as dg


def measure(n: int, reps: int = 3) -> dict:
    from assets.partitions import PARTITIONS_NAME
    from datamask_pipeline.definitions import defs
    from datamask_pipeline.schedules import refresh_stale_shards
    from resources.storage import DataRoot

    with tempfile.TemporaryDirectory() as tmp, dg.instance_for_test(temp_dir=tmp) as inst:
        root = Path(tmp) / "data"
        raw = root / "raw"
        raw.mkdir(parents=True)
        keys = [f"shard_{i:06d}" for i in range(n)]
        for k in keys:
            (raw / f"{k}.parquet").write_bytes(b"PAR1")  # the scan lists, it never reads
        inst.add_dynamic_partitions(PARTITIONS_NAME, keys)
        data_root = DataRoot(root=str(root))
        times = []
        for _ in range(reps):
            with dg.build_schedule_context(instance=inst, resources={"data_root": data_root},
                                           scheduled_execution_time=datetime.now(timezone.utc),
                                           repository_def=defs.get_repository_def()) as ctx:
                t = time.perf_counter()
                data = refresh_stale_shards.evaluate_tick(ctx)
                times.append(time.perf_counter() - t)
        return {"shards": n, "median_s": statistics.median(times), "all_s": times,
                "run_requests": len(data.run_requests or [])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.schedule_tick", description=__doc__)
    p.add_argument("--shards", default="100,1000,5000")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    a = p.parse_args(argv)
    os.environ.setdefault("DATAMASK_PRESET", "pipeline")
    rows = []
    for n in (int(x) for x in a.shards.split(",")):
        rows.append(measure(n))
        print(json.dumps(rows[-1]), flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results_schedule_tick.json").write_text(json.dumps(
        {"command": "python -m bench.schedule_tick --shards " + a.shards, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
