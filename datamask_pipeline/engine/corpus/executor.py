"""Where the corpus stage's per-shard tasks run: in this process, or as Ray tasks.

A task is a module-level function of picklable arguments that reads its one shard from the
data root and returns a small result; an executor maps it over the shards and knows nothing
of what it computes (as datatrove keeps its executors apart from its steps). Each Ray task
asks for one CPU (and ``memory_per_task`` bytes when given), so a worker's peak memory is one
shard's working set and the cluster's scheduler keeps the rest queued.

Ray's own task retries cover a worker that died (a lost node); an exception raised by the
task itself (bad input, an allocation error) is never retried and reaches the caller as the
task's exception type.
"""

from __future__ import annotations

import importlib.util
from typing import Callable

from ..config import ConfigError

__all__ = ["InProcess", "RayTasks", "executor_for", "pick_engine", "ENGINES"]

ENGINES = ("auto", "local", "ray")


class InProcess:
    """Every task in this process, one after the other (a tiny corpus, tests, no Ray)."""

    name = "in-process"
    workers = 1

    def map(self, fn: Callable, args: list, shared=None) -> list:
        """``[fn(shared, *a) for a in args]`` (``shared``: one argument every task gets)."""
        return [fn(shared, *a) for a in args]


class RayTasks:
    """Every task a Ray task on the cluster this process is connected to (``ray.init`` done
    by the caller, e.g. the dagster-ray resource's session). At most ``2 × workers`` tasks
    are in flight, so the results held here stay a few shards' worth."""

    def __init__(self, memory_per_task: int | None = None, max_in_flight: int | None = None):
        import ray

        if not ray.is_initialized():
            raise RuntimeError("RayTasks: this process is not connected to a Ray cluster "
                               "(ray.init first)")
        self._ray = ray
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers = max(1, cpus)
        self.memory = memory_per_task
        self.max_in_flight = max_in_flight or 2 * self.workers
        self.name = f"Ray ({self.workers} CPU)"

    def map(self, fn: Callable, args: list, shared=None) -> list:
        ray = self._ray
        opts = {"num_cpus": 1, "max_retries": 2, "retry_exceptions": False}
        if self.memory:
            opts["memory"] = int(self.memory)
        task = ray.remote(fn).options(**opts)
        shared_ref = ray.put(shared)  # one copy in the object store, not one per task
        out: list = [None] * len(args)
        pending: dict = {}
        nxt = 0
        while nxt < len(args) or pending:
            while nxt < len(args) and len(pending) < self.max_in_flight:
                pending[task.remote(shared_ref, *args[nxt])] = nxt
                nxt += 1
            done, _ = ray.wait(list(pending), num_returns=1)
            for ref in done:
                out[pending.pop(ref)] = ray.get(ref)
        return out


def executor_for(engine: str, n_shards: int | None = None):
    """The executor of an engine name: ``local`` in this process; ``ray`` Ray tasks on the
    cluster this process is connected to; ``auto`` Ray when connected, else in-process."""
    engine = (engine or "auto").strip().lower()
    if engine not in ENGINES:
        raise ValueError(f"corpus engine must be one of {ENGINES}, got {engine!r}")
    if engine == "local":
        return InProcess()
    try:
        import ray
    except ImportError as exc:
        if engine == "ray":
            raise RuntimeError(f"corpus engine 'ray' needs Ray: pip install "
                               f"'datamask-pipeline[ray]' ({exc})") from exc
        return InProcess()
    if ray.is_initialized():
        return RayTasks()
    if engine == "ray":
        raise RuntimeError("corpus engine 'ray': not connected to a Ray cluster")
    return InProcess()


def pick_engine(engine: str, shards: list, mode: str, gather_max_rows: int) -> str:
    """``local`` or ``ray`` for the corpus selection's ``engine`` knob: ``auto`` is Ray where
    the corpus (its kept rows) is past ``gather_max_rows``, the mode runs per-shard passes
    (not gather, random_blocks) and Ray is installed; else this process."""
    name = engine.strip().lower()
    if name not in ENGINES:
        raise ConfigError(f"corpus_selection: engine must be one of {list(ENGINES)} "
                          f"(config key corpus_selection.config.engine), got {engine!r}")
    if name != "auto":
        return name
    rows = sum(s.n_kept if s.n_kept is not None else s.n for s in shards)
    big = rows > gather_max_rows and mode not in ("gather", "random_blocks")
    return "ray" if big and importlib.util.find_spec("ray") is not None else "local"
