"""Shared helpers: data, machine description, clocks, whole-shard scoring."""

from __future__ import annotations

import os
import platform
import resource
import statistics
import time
from contextlib import contextmanager

import numpy as np


# ------------------------------------------------------------------ machine
def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def peak_rss_bytes() -> int:
    """This process's peak resident memory: VmHWM of /proc/self/status (reset by exec, so a
    child started by a large parent does not inherit its peak; ``ru_maxrss`` is carried across
    fork + exec on Linux), else ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _mem_total_gib() -> float | None:
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2**30
    except (ValueError, OSError):
        return None


def loadavg():
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def machine_info(device) -> dict:
    import pyarrow
    import torch

    info = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cpu_model": cpu_model(),
        "memory_gib": round(_mem_total_gib() or 0, 1),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "numpy": np.__version__,
        "pyarrow": pyarrow.__version__,
        "device": str(device),
        "loadavg_start": loadavg(),
    }
    if getattr(device, "type", str(device)) == "cuda":
        info["cuda_device"] = torch.cuda.get_device_name(device)
        info["cuda_version"] = torch.version.cuda
    try:
        import dagster

        info["dagster"] = dagster.__version__
    except Exception:  # pragma: no cover - optional
        pass
    return info


# ------------------------------------------------------------------ clocks
def sync(device) -> None:
    if getattr(device, "type", str(device)) == "cuda":
        import torch

        torch.cuda.synchronize(device)


class Timer:
    """Wall and process-CPU seconds of a block (the machine is shared: CPU time shows how much
    of a wall-time difference is contention)."""

    def __init__(self, device="cpu"):
        self.device = device
        self.wall = self.cpu = 0.0

    def __enter__(self):
        sync(self.device)
        self._w, self._c = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        sync(self.device)
        self.wall = time.perf_counter() - self._w
        self.cpu = time.process_time() - self._c
        return False


def median(xs):
    xs = [v for v in xs if v is not None]
    return statistics.median(xs) if xs else None


def time_fn(fn, reps: int = 5, warmup: int = 1, device="cpu") -> float:
    """Median wall seconds of fn() over reps (after warmup)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(reps):
        with Timer(device) as t:
            fn()
        out.append(t.wall)
    return median(out)


def interleaved(fns: dict, reps: int = 5, warmup: int = 1, device="cpu") -> dict:
    """Median wall seconds of each fn, measured round-robin (a, b, a, b, ...) so that machine
    noise hits every contender alike. Returns {name: {"median_s", "all_s"}}."""
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {k: [] for k in fns}
    for _ in range(reps):
        for k, fn in fns.items():
            with Timer(device) as t:
                fn()
            times[k].append(t.wall)
    return {k: {"median_s": median(v), "all_s": v} for k, v in times.items()}


# -------------------------------------------------------------------- data
def sample_data(n: int, d: int, seed: int = 0):
    """The engine's synthetic shard generator (engine/sample.py) as numpy arrays."""
    from datamask_pipeline.engine.sample import make_table

    t = make_table(n, dim=d, seed=seed)
    x = np.asarray(t.column("feature_arr").combine_chunks().flatten()).reshape(n, d).copy()
    q = t.column("quality_score").to_numpy().copy()
    ids = t.column("chunk_id").to_numpy().copy()
    return x.astype(np.float32), q.astype(np.float64), ids


def parquet_data(path: str):
    from datamask_pipeline.engine.data import read_shard

    sh = read_shard(path)
    return (np.ascontiguousarray(sh.embeddings, dtype=np.float32),
            np.asarray(sh.quality, dtype=np.float64), np.asarray(sh.ids))


class DataSource:
    """Shards of n rows: the sample generator at (n, d), or the first n rows of a parquet."""

    def __init__(self, d: int, seed: int = 0, parquet: str | None = None):
        self.d, self.seed, self.parquet = d, seed, parquet
        self._full = parquet_data(parquet) if parquet else None

    @property
    def max_n(self):
        return None if self._full is None else self._full[0].shape[0]

    def describe(self) -> dict:
        if self._full is not None:
            return {"kind": "parquet", "path": self.parquet, "rows": int(self.max_n),
                    "d": int(self._full[0].shape[1])}
        return {"kind": "sample", "generator": "datamask_pipeline.engine.sample.make_table",
                "d": self.d, "seed": self.seed}

    def get(self, n: int):
        if self._full is None:
            return sample_data(n, self.d, self.seed)
        x, q, ids = self._full
        if n > x.shape[0]:
            raise ValueError(f"parquet has {x.shape[0]} rows, fewer than n={n}")
        return x[:n].copy(), q[:n].copy(), ids[:n].copy()


# ----------------------------------------------------------------- scoring
class Scorer:
    """Whole-shard f of selections for one (shard, term, lambda) via engine.evaluate."""

    def __init__(self, x, q, term: str, lamb: float, device="cpu"):
        from datamask_pipeline.engine.evaluate import make_ground_set

        self.term, self.lamb, self.device = term, lamb, device
        self.x, self.q = x, q
        self.ground = make_ground_set(x, q, device=device)
        self.calls = 0
        self.seconds = 0.0

    def __call__(self, idx) -> float:
        from datamask_pipeline.engine.evaluate import evaluate_selection

        t = time.perf_counter()
        r = evaluate_selection(None, None, np.asarray(idx), lamb=self.lamb, terms=(self.term,),
                               ground=self.ground)
        self.calls += 1
        self.seconds += time.perf_counter() - t
        return float(r["f"][self.term])


@contextmanager
def torch_threads(n: int | None):
    import torch

    old = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def write_report(out_dir: str, tag: str | None, results: dict, markdown: str) -> None:
    """``results_<tag>.json`` and ``REPORT_<tag>.md`` (with the command) under ``out_dir``;
    nothing without a tag."""
    import json
    import os

    if not tag:
        return
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, f"results_{tag}.json"), "w") as fh:
        json.dump(results, fh, indent=1, default=float)
    with open(os.path.join(out_dir, f"REPORT_{tag}.md"), "w") as fh:
        fh.write(f"# {tag}\n\nCommand: `{results['command']}`\n\n{markdown}\n")


def main_job_on_texts(root: str, ids, texts: list, file_of, args: list) -> tuple:
    """Write the corpus as files of only ``id`` and ``text`` (``part_<f>.parquet``, one per
    value of ``file_of``) into a fresh ``root``, run :func:`main_job` there; returns (each
    selected row's position in ``ids``, the job's wall seconds)."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    ids, file_of = np.asarray(ids), np.asarray(file_of)
    for f in np.unique(file_of):
        m = np.flatnonzero(file_of == f)
        pq.write_table(pa.table({"id": ids[m], "text": [texts[i] for i in m]}),
                       os.path.join(root, f"part_{f}.parquet"))
    sel, secs = main_job(root, args)
    pos = {d: i for i, d in enumerate(ids.tolist())}
    return np.array([pos[d] for d in sel], dtype=np.int64), secs


def main_job(root: str, args: list) -> tuple:
    """Run the README's main job (``python -m datamask_pipeline.demo --data-root root`` plus
    ``args``) as a subprocess on its own Dagster instance (``root/.dagster_home``); returns
    (the ``id`` of every row it wrote under ``selected/``, or ``selected_per_shard/`` with
    ``--per-shard-chain``; its wall seconds). Raises with the job's output when it fails."""
    import subprocess
    import sys

    import pyarrow.parquet as pq

    cmd = [sys.executable, "-m", "datamask_pipeline.demo", "--data-root", root, *args]
    env = {**os.environ, "DAGSTER_HOME": os.path.join(root, ".dagster_home")}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    secs = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    sel_dir = os.path.join(root, "selected_per_shard" if "--per-shard-chain" in args
                           else "selected")
    ids = [pq.read_table(os.path.join(sel_dir, fn), columns=["id"]).column("id")
           .to_numpy(zero_copy_only=False)
           for fn in sorted(os.listdir(sel_dir)) if fn.endswith(".parquet")]
    return (np.concatenate(ids) if ids else np.array([], dtype=object)), secs
