"""One worker of a parallel backfill: materialize the per-shard chain of some partitions as
separate runs against the Dagster instance of ``$DAGSTER_HOME`` (the product's job, resources
from the environment, like every other command of the project).

    python -m tests.reliability.backfill_worker GO_PREFIX ROUNDS KEY [KEY ...] [--multiprocess]

The worker imports everything, writes ``GO_PREFIX.ready.<pid>``, then for each round r in
1..ROUNDS waits for the file ``GO_PREFIX.<r>`` and runs all its keys, so that all workers start
their runs at the same moment (and a second backfill does not pay the imports again). Default: the
product's ``datamask_job`` (in-process executor); ``--multiprocess``: the same assets through
``tests/reliability/mp_defs.py``'s job with the multiprocess executor (``dg.execute_job``,
every step in its own process). Prints one JSON line per run.
"""

import json
import os
import sys
import time

RUN_CONFIG = {
    "ops": {"mask": {"config": {"n_epochs": 30, "n_rollout": 16, "partial": 0.2,
                                "select_ratio": 0.1}}},
    "resources": {"learner": {"config": {"shard_report": False}}},
    "loggers": {"console": {"config": {"log_level": "INFO"}}},
}


def mp_chain_job():
    from tests.reliability.mp_defs import defs

    return defs.resolve_job_def("mp_chain_job")


def main(argv=None) -> int:
    args = list(argv or sys.argv[1:])
    multiprocess = "--multiprocess" in args
    args = [a for a in args if a != "--multiprocess"]
    go, rounds, keys = args[0], int(args[1]), args[2:]
    import dagster as dg

    from datamask_pipeline.definitions import defs

    job = defs.resolve_job_def("datamask_job")
    with open(f"{go}.ready.{os.getpid()}", "w"):
        pass
    with dg.DagsterInstance.get() as instance:
        for rnd in range(1, rounds + 1):
            deadline = time.monotonic() + 900
            while not os.path.exists(f"{go}.{rnd}"):
                if time.monotonic() > deadline:
                    raise SystemExit("never told to go")
                time.sleep(0.01)
            for key in keys:
                if multiprocess:
                    with dg.execute_job(dg.reconstructable(mp_chain_job), instance=instance,
                                        run_config=RUN_CONFIG, tags={"dagster/partition": key},
                                        raise_on_error=False) as result:
                        ok, run_id = result.success, result.run_id
                else:
                    result = job.execute_in_process(partition_key=key, instance=instance,
                                                    run_config=RUN_CONFIG, raise_on_error=False)
                    ok, run_id = result.success, result.run_id
                print(json.dumps({"round": rnd, "key": key, "run_id": run_id, "success": ok}),
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
