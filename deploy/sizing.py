"""Sizing tables for a cluster run of DATAMASK: shards, memory per pod, GPU-hours per shard.

    .venv/bin/python deploy/sizing.py                      # the tables of deploy/SIZING.md
    .venv/bin/python deploy/sizing.py --rows 2e10 --dim 768 --rows-per-shard 1e6

Memory numbers come from the engine's own pre-flight estimate,
``datamask_pipeline.engine.learner.estimate_memory`` (the number the mask asset logs and
checks before it starts), evaluated for the *target* GPU: the objective workspace is the
engine's CUDA budget (``objectives.default_mem_budget`` for a CUDA device, 2 GiB) and the
"does it fit on this machine" check is switched off (this machine is not the GPU node), so
the estimate is returned for any size instead of raising. Step rates come from the
benchmark's result files (``bench/results/*.json``) when they exist; nothing is invented.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import sys
from pathlib import Path
from unittest import mock

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(REPO))

GIB = 2**30

# Dagster's documented guidance: at most 100,000 partitions per asset ("assets with partition
# counts exceeding this limit will likely have slower load times in the UI"). Every shard is
# also one run (a run-worker pod plus one pod per step), so far fewer is better.
DAGSTER_PARTITION_LIMIT = 100_000
COMFORTABLE_PARTITIONS = 25_000

# (n rows per shard, d, G rollouts, partial): the paper's block size (~1M, 768-d) and
# settings around it.
DEFAULT_SETTINGS = [
    (250_000, 384, 128, 0.1),
    (1_000_000, 384, 128, 0.1),
    (1_000_000, 768, 128, 0.1),
    (1_000_000, 768, 256, 0.05),
    (1_000_000, 768, 128, 0.2),
    (2_000_000, 768, 128, 0.1),
    (4_000_000, 768, 128, 0.1),
    (4_000_000, 1024, 256, 0.1),
]
DEFAULT_CORPORA = [1e8, 1e9, 1e10, 2.5e10]
DEFAULT_SHARD_ROWS = [250_000, 1_000_000, 4_000_000]
GPU_SIZES_GIB = (24, 40, 80, 141)

# Host memory of the mask pod (a model, not a measurement): the features parquet is read into
# an Arrow table and a float32 numpy array (about 2 x n*d*4 at the peak of the read), plus the
# interpreter, torch and the CUDA context (~3 GiB).
HOST_COPIES = 2.0
HOST_BASE_BYTES = 3 * GIB
# After learning, the whole-shard evaluation puts the shard on the device once more and caches
# a unit-normalised copy (2 x n*d*4), while the learner's own tensors are released: the
# device peak is the larger of the two phases.
EVAL_COPIES = 2.0


def shard_count(rows: float, rows_per_shard: float) -> int:
    if rows <= 0 or rows_per_shard <= 0:
        raise ValueError("rows and rows per shard must be positive")
    return int(math.ceil(rows / rows_per_shard))


def partition_verdict(shards: int) -> str:
    if shards <= COMFORTABLE_PARTITIONS:
        return "fine"
    if shards <= DAGSTER_PARTITION_LIMIT:
        return "within Dagster's 100k guidance; UI slower"
    return "too many: use bigger shards"


def min_rows_per_shard(rows: float, max_partitions: int = COMFORTABLE_PARTITIONS) -> int:
    """Smallest shard size that keeps the partition count at or under ``max_partitions``."""
    return int(math.ceil(rows / max_partitions))


def gpu_estimate(n: int, d: int, n_rollout: int, partial: float, itemsize: int = 4,
                 **cfg_kwargs) -> dict:
    """``estimate_memory`` for a CUDA pod: parts and total in bytes, plus the derived device
    peak (learning vs whole-shard evaluation) and the host memory request."""
    import torch

    from datamask_pipeline.engine import learner
    from datamask_pipeline.engine.config import LearnerConfig
    from datamask_pipeline.engine.objectives import default_mem_budget

    cfg = LearnerConfig(n_rollout=n_rollout, partial=partial, **cfg_kwargs)
    cfg.validate(n)
    budget = default_mem_budget(torch.device("cuda"))
    # The fit check compares with *this* machine's free memory; the question here is the
    # target GPU, so report the estimate whatever its size.
    with mock.patch.object(learner, "device_memory", return_value=1 << 62):
        est = learner.estimate_memory(n, d, cfg, device="cpu", itemsize=itemsize,
                                      mem_budget=budget)
    emb = n * d * itemsize
    eval_peak = EVAL_COPIES * emb + budget
    device_peak = max(est["total_bytes"], eval_peak)
    host = HOST_COPIES * emb + HOST_BASE_BYTES
    sizes = cfg.sizes(n)
    return {
        "n": n, "d": d, "G": n_rollout, "partial": partial,
        "batch": sizes["batch"], "k_batch": sizes["k_batch"],
        "parts": est["parts"], "learn_total_bytes": est["total_bytes"],
        "eval_peak_bytes": int(eval_peak), "device_peak_bytes": int(device_peak),
        "host_bytes": int(host),
        "smallest_gpu_gib": next((g for g in GPU_SIZES_GIB if device_peak * 1.1 <= g * GIB), None),
    }


def _gib(b: float) -> str:
    return f"{b / GIB:.2f}"


def _k8s_memory(b: float) -> str:
    """Round a byte count up to a whole Gi for a pod's memory request."""
    return f"{int(math.ceil(b / GIB))}Gi"


# ------------------------------------------------------------------ benchmark results
_RATE_KEYS = ("steps_per_s", "steps_per_sec", "steps_per_second", "step_rate", "steps_s")


def _walk(obj, ctx=None):
    """Yield (record, context) for every dict that holds a step rate."""
    ctx = dict(ctx or {})
    if isinstance(obj, dict):
        local = {k: v for k, v in obj.items() if not isinstance(v, (dict, list))}
        ctx.update(local)
        if any(k in obj for k in _RATE_KEYS):
            yield obj, ctx
        for v in obj.values():
            if isinstance(v, (dict, list)):
                yield from _walk(v, ctx)
    elif isinstance(obj, list):
        for v in obj:
            yield from _walk(v, ctx)


def load_bench_rates(pattern: str | None = None) -> list[dict]:
    """Step rates found in the benchmark's JSON results: one row per measured setting with the
    fields it states (device, n, d, G, partial ...). Empty when there are none."""
    pattern = pattern or str(REPO / "bench" / "results" / "*.json")
    rows = []
    for path in sorted(glob.glob(pattern)):
        try:
            with open(path) as fh:
                data = json.load(fh)
        except (OSError, ValueError):
            continue
        for rec, ctx in _walk(data):
            rate = next(rec[k] for k in _RATE_KEYS if k in rec)
            if not isinstance(rate, (int, float)) or rate <= 0:
                continue
            row = {"file": os.path.relpath(path, REPO), "steps_per_s": float(rate)}
            for name, keys in {
                "device": ("device",), "n": ("n", "rows", "n_rows"), "d": ("d", "dim"),
                "G": ("G", "n_rollout", "rollouts"), "partial": ("partial",),
                "algorithm": ("algorithm",),
            }.items():
                for k in keys:
                    if k in ctx:
                        row[name] = ctx[k]
                        break
            rows.append(row)
    return rows


def gpu_hours_per_shard(steps_per_s: float, n_epochs: int = 5000) -> float:
    return n_epochs / steps_per_s / 3600.0


# ------------------------------------------------------------------ tables
def shards_table(corpora=DEFAULT_CORPORA, shard_rows=DEFAULT_SHARD_ROWS) -> str:
    out = ["| rows N | rows per shard | shards (= partitions = runs) | verdict |",
           "|---:|---:|---:|---|"]
    for rows in corpora:
        for s in shard_rows:
            c = shard_count(rows, s)
            out.append(f"| {rows:,.0f} | {s:,} | {c:,} | {partition_verdict(c)} |")
    return "\n".join(out)


def memory_table(settings=DEFAULT_SETTINGS) -> str:
    out = ["| n per shard | d | G | partial | batch m | k' | embeddings GiB | Gumbel keys + masks GiB "
           "| objective workspace GiB | estimate_memory total GiB | device peak GiB (learn vs eval) "
           "| smallest GPU that fits (GB class, 10% headroom) | pod memory request (host) |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for n, d, g, p in settings:
        e = gpu_estimate(n, d, g, p)
        parts = e["parts"]
        out.append(
            f"| {n:,} | {d} | {g} | {p} | {e['batch']:,} | {e['k_batch']:,} "
            f"| {_gib(parts['embeddings'])} | {_gib(parts['gumbel_keys'] + parts['masks'])} "
            f"| {_gib(parts['objective_workspace'])} | {_gib(e['learn_total_bytes'])} "
            f"| {_gib(e['device_peak_bytes'])} | {e['smallest_gpu_gib'] or '> 141'} "
            f"| {_k8s_memory(e['host_bytes'])} |"
        )
    return "\n".join(out)


def rates_table(rates: list[dict], n_epochs: int = 5000) -> str:
    """GPU step rates only (a CPU rate is no GPU-hour); "not measured" while there are none."""
    out = ["| source | device | n | d | G | partial | steps/s | hours per shard "
           f"({n_epochs:,} steps) | status |",
           "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    gpu = [r for r in rates if str(r.get("device", "")).startswith("cuda")]
    for r in gpu:
        out.append(
            f"| {r['file']} | {r['device']} | {r.get('n', '?')} | {r.get('d', '?')} | {r.get('G', '?')} "
            f"| {r.get('partial', '?')} | {r['steps_per_s']:.3g} "
            f"| {gpu_hours_per_shard(r['steps_per_s'], n_epochs):.3g} | measured |")
    if not gpu:
        out.append("| — | cuda | 1,000,000 | 768 | 128 | 0.05 | not measured | not measured "
                   "| not measured: no GPU run in bench/results (bash bench/gpu.sh) |")
    return "\n".join(out)


# ------------------------------------------------------------------ CPU: measured solver times
SOLVER_RESULTS = REPO / "bench" / "results" / "results_solvers.json"
THROUGHPUT_RESULTS = REPO / "bench" / "results" / "results_throughput.json"
EMBED_RESULTS = REPO / "bench" / "results" / "results_embed.json"
SOLVERS = ("topk+polish", "sgreedy+polish", "paper", "paper+polish", "greedy")
# A CPU node for the node counts (an assumption, not a measurement): cores run one shard each
# (the solver times were measured with one torch thread), memory bounds the shards at once.
NODE_CORES = 32
NODE_MEMORY_GIB = 128
DEADLINE_H = 24.0


def solver_times(path=None) -> list[dict]:
    """(term, solver, n, d, seconds) of every measured solver cell of bench/solvers.py's
    results (the last cell of a (term, n) wins); [] when the file is missing."""
    path = Path(path or SOLVER_RESULTS)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    cells = {}
    for c in data.get("cells", []):
        cells[(c["term"], int(c["n"]))] = c
    rows = []
    for (term, n), c in sorted(cells.items()):
        for solver, r in c.get("solvers", {}).items():
            if not isinstance(r, dict) or not r.get("time_s") or r.get("extrapolated"):
                continue
            runs = r.get("runs") or [{}]
            rows.append({"term": term, "solver": solver, "n": n, "d": int(c["d"]),
                         "partial": c.get("partial"), "steps": c.get("steps"),
                         "time_s": float(r["time_s"]), "reps": r.get("reps", 1),
                         "polish_converged": runs[0].get("converged"),
                         # why the polish ended (newer results) and the budget it ran under
                         # (a run's, a solver's or the whole bench's; absent: none was set)
                         "polish_stop": runs[0].get("stop"),
                         "polish_budget_s": _budget(runs[0], r, c, data),
                         "file": os.path.relpath(path, REPO)})
    return rows


def _budget(*records) -> float | None:
    """The polish time budget recorded on the first record that has one (None: no budget)."""
    for rec in records:
        for key in ("polish_time_budget_s", "time_budget_s", "polish_budget_s"):
            v = (rec or {}).get(key)
            if v is None and isinstance((rec or {}).get("settings"), dict):
                v = rec["settings"].get(key)
            if v is not None:
                return float(v)
    return None


def polish_stop(r: dict) -> str | None:
    """Why a measured cell's polish ended: ``time_budget`` only when the run says so, or when
    it did not converge and ran under a budget; ``not_converged`` when it did not converge
    with no budget set (DiSF's default partial check of its most promising members, or
    max_rounds), the stop itself when the results record it; None when it converged or ran
    no polish."""
    if r.get("polish_converged") is not False:
        return None
    stop = r.get("polish_stop")
    if stop:
        return stop
    return "time_budget" if r.get("polish_budget_s") is not None else "not_converged"


def fit_growth(points) -> dict | None:
    """Least-squares fit of log t = log a + b log n over (n, t) with >= 2 distinct n."""
    pts = [(float(n), float(t)) for n, t in points if n > 0 and t > 0]
    if len({n for n, _ in pts}) < 2:
        return None
    xs = [math.log(n) for n, _ in pts]
    ys = [math.log(t) for _, t in pts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return {"a": math.exp(my - b * mx), "b": b}


def cpu_per_shard(rows: list[dict], n_target: int = 1_000_000) -> list[dict]:
    """CPU seconds of one shard of ``n_target`` rows per (term, solver): measured where a cell
    of that size exists, else the growth fit over the measured sizes extrapolated to it."""
    out = []
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["term"], r["solver"]), []).append(r)
    for (term, solver), rs in sorted(groups.items()):
        rs.sort(key=lambda r: r["n"])
        fit = fit_growth([(r["n"], r["time_s"]) for r in rs])
        exact = [r for r in rs if r["n"] == n_target]
        if exact:
            secs, how = exact[-1]["time_s"], "measured"
        elif fit:
            secs, how = fit["a"] * n_target ** fit["b"], "extrapolated"
        else:
            continue
        top = rs[-1]
        out.append({"term": term, "solver": solver, "d": top["d"], "n": n_target,
                    "seconds": secs, "how": how, "exponent": fit["b"] if fit else None,
                    "sizes": [r["n"] for r in rs], "largest_n_s": top["time_s"],
                    "steps": top["steps"], "partial": top["partial"],
                    "polish_stopped_by_budget": any(polish_stop(r) == "time_budget" for r in rs),
                    "polish_stops": sorted({polish_stop(r) for r in rs} - {None, "time_budget"})})
    return out


def cpu_host_bytes(n: int, d: int, itemsize: int = 4) -> int:
    """Host memory of a CPU mask pod (a model): the embeddings read as Arrow + numpy (2 copies)
    plus the engine's whole-shard working set (a unit-normalised copy), plus the interpreter
    and torch (1 GiB)."""
    return int(3 * n * d * itemsize + GIB)


def io_peaks(path=None) -> dict:
    """Measured peak RSS (bytes) and rows of the file steps, from bench/throughput.py."""
    try:
        data = json.loads(Path(path or THROUGHPUT_RESULTS).read_text())
    except (OSError, ValueError):
        return {}
    return {v: {"peak_bytes": r["peak_rss_mib"] * 2**20, "rows": r["rows"], "dim": data["dim"],
                "median_s": r["median_s"]}
            for v, r in data.get("variants", {}).items() if v.endswith("_ours")}


def shards_per_node(mem_bytes: float, cores: int = NODE_CORES, memory_gib: float = NODE_MEMORY_GIB) -> int:
    return max(0, min(cores, int(memory_gib * GIB // max(1, mem_bytes))))


def nodes_needed(rows: float, shard_seconds: float, per_node: int, rows_per_shard: int = 1_000_000,
                 deadline_h: float = DEADLINE_H) -> int:
    """CPU nodes to finish ``rows`` within ``deadline_h`` hours, shards packed per node."""
    if per_node < 1:
        raise ValueError("a shard does not fit on one node")
    shards = shard_count(rows, rows_per_shard)
    node_seconds = shards * shard_seconds / per_node
    return int(math.ceil(node_seconds / (deadline_h * 3600)))


# how cpu_table names a polish that ended without a local optimum and without a budget
_STOP_LABELS = {"not_converged": "ended at the partial check or round limit",
                "partial_check": "ended at DiSF's partial check", "max_rounds": "hit max_rounds"}


def cpu_table(rows=None, n_target: int = 1_000_000, d_memory: int = 768,
              corpora=(1e9, 1e10)) -> str:
    rows = solver_times() if rows is None else rows
    est = cpu_per_shard(rows, n_target)
    if not est:
        return "No solver results in bench/results/results_solvers.json: not measured."
    mem = cpu_host_bytes(n_target, d_memory)
    per_node = shards_per_node(mem)
    head = (f"| term | solver | CPU time per {n_target:,}-row shard (1 thread, d = {est[0]['d']}) "
            f"| from | host memory per shard, d = {d_memory} (model) | shards per node "
            f"({NODE_CORES} cores, {NODE_MEMORY_GIB} GiB) "
            + "".join(f"| nodes for {c:.0e} rows in {DEADLINE_H:g} h " for c in corpora) + "|")
    out = [head, "|---|---|---:|---|---:|---:|" + "---:|" * len(corpora)]
    for e in est:
        hours = e["seconds"] / 3600
        src = (f"measured at n = {e['n']:,}" if e["how"] == "measured" else
               f"n^{e['exponent']:.2f} fit over n = {', '.join(f'{n:,}' for n in e['sizes'])} "
               f"({e['largest_n_s']:.3g} s at {e['sizes'][-1]:,})")
        if e["solver"].startswith("paper"):
            src += (f"; the bench's learner: {e['steps']:,} steps, batch m = "
                    f"{e['partial'] * e['sizes'][-1]:,.0f} at the largest n (not 5,000 steps)")
        if e["polish_stopped_by_budget"]:
            src += "; polish stopped by its time budget: a lower bound"
        stops = [_STOP_LABELS.get(st, st) for st in e.get("polish_stops", [])]
        if stops:
            src += f"; polish not converged, no time budget ({', '.join(stops)})"
        nodes = "".join(f"| {nodes_needed(c, e['seconds'], per_node, n_target):,} " for c in corpora)
        out.append(f"| {e['term']} | `{e['solver']}` | {e['seconds']:,.0f} s ({hours:.3g} h) | {src} "
                   f"| {_gib(mem)} GiB | {per_node} {nodes}|")
    return "\n".join(out)


LARGE_SHARD_GLOB = str(REPO / "bench" / "results" / "results_large_shard*.json")


def large_shard_runs(pattern: str | None = None) -> list[dict]:
    """Every term's 10^6-row pipeline run of bench/large_shard.py (one row per term; a later
    file's row for a term wins; quick-mode files are ignored)."""
    rows: dict = {}
    for f in sorted(glob.glob(pattern or LARGE_SHARD_GLOB)):
        try:
            data = json.loads(Path(f).read_text())
        except (OSError, ValueError):
            continue
        if "quick" in str(data.get("tag", "")):
            continue
        for term, r in data.get("terms", {}).items():
            rows[term] = {**r, "term": term, "rows": data["rows"], "dim": data["dim"],
                          "threads": data.get("threads"),
                          "file": os.path.relpath(f, REPO), "command": data.get("command")}
    return [rows[t] for t in sorted(rows)]


def large_shard_table(runs=None, corpora=(1e9, 1e10)) -> str:
    """Measured per-shard CPU cost of the whole chain at the shard size of the runs: wall and
    CPU time of features -> checks -> mask -> subset, peak RSS of the run's process tree;
    shards per node (bounded by cores at the run's CPU/wall and by memory at its peak RSS)
    and nodes for a corpus derived from those numbers."""
    runs = large_shard_runs() if runs is None else runs
    if not runs:
        return "No 10⁶-row pipeline runs in bench/results/results_large_shard*.json: not measured."
    out = ["| term | rows × d | route (solver `auto`) | mask step | whole chain (wall) "
           "| CPU time (user + sys) | peak RSS (measured) "
           "| f: selection / quality top-k / stochastic greedy "
           f"| shards per node ({NODE_CORES} cores, {NODE_MEMORY_GIB} GiB) "
           + "".join(f"| nodes for {c:.0e} rows in {DEADLINE_H:g} h " for c in corpora) + "| from |",
           "|---|---|---|---:|---:|---:|---:|---|---:|" + "---:|" * len(corpora) + "---|"]
    for r in runs:
        size = f"{r['rows']:,} × {r['dim']}"
        if r.get("refused") or r.get("rc"):
            msg = " ".join(str(r.get("refused", "")).split())[:160]
            out.append(f"| {r['term']} | {size} | refused by the pre-flight: {msg} | | | "
                       f"| {_gib(r['peak_rss_bytes'])} GiB | |" + " |" * (len(corpora) + 1)
                       + f" {r['file']} |")
            continue
        steps = r.get("steps_s", {})
        chain = sum(steps.values()) or r["wall_s"]
        cores = max(1, round(r["cpu_s"] / r["wall_s"]))  # cores one shard kept busy
        per_node = min(NODE_CORES // cores, shards_per_node(r["peak_rss_bytes"]))
        sc = r["scores"]
        sel = sc.get("datamask") or sc.get("selection")
        sg = (r.get("reference") or {}).get("stochastic_greedy")
        f = f"{sel['f']:.4f} / {sc['quality_topk']['f']:.4f} / " + (
            f"{sg['f']:.4f}" if sg else "not run")
        knobs = {k: v for k, v in r.get("config", {}).items() if k != "algorithm"}
        route = f"`{r['route']}`" + (f" ({', '.join(f'{k}={v}' for k, v in knobs.items())})"
                                     if knobs else "")
        nodes = "".join(f"| {nodes_needed(c, r['wall_s'], per_node, r['rows']):,} "
                        for c in corpora)
        out.append(f"| {r['term']} | {size} | {route} | {steps.get('mask', 0):,.0f} s "
                   f"| {r['wall_s']:,.0f} s ({chain:,.0f} s in steps) "
                   f"| {r['cpu_s']:,.0f} s | {_gib(r['peak_rss_bytes'])} GiB | {f} "
                   f"| {per_node} {nodes}| {r['file']} |")
    return "\n".join(out)


def io_table(path=None, n_target: int = 1_000_000) -> str:
    peaks = io_peaks(path)
    if not peaks:
        return "No I/O results in bench/results/results_throughput.json: not measured."
    names = {"ingest_ours": "features (ingest)", "validate_ours": "validate_features (DuckDB checks)",
             "subset_ours": "selected_subset (write the rows)"}
    out = ["| step | rows x d measured | peak RSS GiB (measured) | time at that size (median s) "
           f"| time per {n_target:,} rows if linear |", "|---|---|---:|---:|---:|"]
    for v, p in peaks.items():
        out.append(f"| {names.get(v, v)} | {p['rows']:,} x {p['dim']} | {_gib(p['peak_bytes'])} "
                   f"| {p['median_s']:.3g} | {p['median_s'] * n_target / p['rows']:.3g} s |")
    return "\n".join(out)


def embed_table(path=None, corpora=(1e9, 1e10)) -> str:
    """CPU cost of embedding with the default model, from bench/embed.py's measured rates:
    core-hours = documents / (documents/s at one thread) / 3600."""
    try:
        data = json.loads(Path(path or EMBED_RESULTS).read_text())
    except (OSError, ValueError):
        return "No embedding results in bench/results/results_embed.json: not measured."
    s = data["sample"]
    out = [f"| variant ({data['model']['name']}, {s['docs']:,} documents, mean "
           f"{s['tokens_per_doc']['mean']:.0f} tokens) | documents/s (1 thread, median) "
           "| tokens/s | peak RSS GiB |"
           + "".join(f" core-hours for {c:.0e} documents |" for c in corpora),
           "|---|---:|---:|---:|" + "---:|" * len(corpora)]
    for name in ("embed_shard", "reference"):
        v = data["variants"][name]
        out.append(f"| `{name}` | {v['docs_per_s']:,.0f} | {v['tokens_per_s']:,.0f} "
                   f"| {_gib(v['peak_rss_mib'] * 2**20)} |"
                   + "".join(f" {c / v['docs_per_s'] / 3600:,.0f} |" for c in corpora))
    return "\n".join(out)


CORPUS_SCALE_GLOB = str(REPO / "bench" / "results" / "results_corpus_scale*.json")


def corpus_stage_table(pattern: str | None = None, shards: int = 25_000,
                       rows_per_shard: int = 1_000_000, coordinator_rows: int = 4_000_000,
                       workers: int = 1_000) -> str:
    """The corpus stage (exchange mode) extended from the measured >= 10^7-row runs to
    ``shards`` shards: per-shard selection and per-round pass times per shard (they run on the
    shards' own workers), and what the coordinator holds per round (2 x candidates rows per
    shard, so the candidates per shard fall as the shard count grows)."""
    runs = []
    for f in sorted(glob.glob(pattern or CORPUS_SCALE_GLOB)):
        try:
            runs.append(json.loads(Path(f).read_text()))
        except (OSError, ValueError):
            continue
    if not runs:
        return "not measured (no results_corpus_scale*.json in bench/results)"
    lines = ["| measured run | rows × d | per-shard selection, s/shard | pass per round, s/shard | "
             "rounds | swaps | peak RSS | candidates at "
             f"{shards:,} shards | coordinator per round | wall per round on {workers:,} workers |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        n_sh = r["shards"]
        scale = rows_per_shard / (r["rows"] / n_sh)
        per_shard = r["per_shard_phase_s"] / n_sh * scale
        passes = [x["seconds"] for x in r["round_log"]] or [0.0]
        pass_s = float(sorted(passes)[len(passes) // 2]) / n_sh * scale
        cand = max(1, coordinator_rows // (2 * shards))
        coord = 2 * cand * shards * (r["dim"] * 4 + 16)
        wall_round = pass_s * math.ceil(shards / workers)
        lines.append(
            f"| {r.get('cut', 'random_blocks')}, {r['term']} | {r['rows']:,} × {r['dim']} | "
            f"{per_shard:.1f} | {pass_s:.1f} | {len(r['round_log'])} | {sum(x['swaps'] for x in r['round_log']):,} | "
            f"{r['peak_rss_bytes'] / GIB:.2f} GiB | {cand:,} per side | "
            f"{coord / GIB:.1f} GiB in {2 * cand * shards:,} rows | {wall_round:.0f} s |")
    return "\n".join(lines)


CORPUS_RAY_GLOB = str(REPO / "bench" / "results" / "results_corpus_ray_*.json")


def corpus_tasks_table(pattern: str | None = None, rows: float = 1e10, shards: int = 25_000,
                       workers: int = 1_000, d: int = 256) -> str:
    """The corpus stage as Ray tasks (``python -m bench.corpus_ray scale``), measured per task
    on this machine's local Ray, and extended to ``rows`` in ``shards`` shards on ``workers``
    one-CPU workers: a task's time grows with its shard's rows (linear, as the per-shard solver
    and the candidate pass do) and the phases spread over the workers. The coordinator's
    candidates per round at ``d`` are the engine's own bound (``sharded.candidate_cap``)."""
    from datamask_pipeline.engine.corpus.sharded import (CANDIDATE_BYTES, CANDIDATES_TOTAL,
                                                         candidate_cap)

    runs = []
    for f in sorted(glob.glob(pattern or CORPUS_RAY_GLOB)):
        try:
            r = json.loads(Path(f).read_text())
        except (OSError, ValueError):
            continue
        if "timings" in r:  # scale runs only (not the speedup records)
            runs.append(r)
    if not runs:
        return "not measured (no results_corpus_ray_*.json in bench/results)"
    per = rows / shards
    lines = ["| measured run | rows × d (shards) | coordinator peak RSS | worker peak RSS | "
             "per-shard selection, worker-s/shard | pass per round, worker-s/shard | rounds | "
             f"at {rows:.0e} rows in {shards:,} shards on {workers:,} workers: selection | "
             "per round |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in sorted(runs, key=lambda r: (r["cut"], r["rows"])):
        w, n_sh = r["workers"], r["shards"]
        sel = r["timings"]["shards_s"] * w / n_sh
        passes = [x["seconds"] for x in r["rounds"]] or [0.0]
        pass_s = float(sorted(passes)[len(passes) // 2]) * w / n_sh
        grow = per / (r["rows"] / n_sh)
        waves = math.ceil(shards / workers)
        lines.append(
            f"| {r['cut']}, {r['term']} | {r['rows']:,} × {r['dim']} ({n_sh:,}) | "
            f"{r['coordinator_peak_rss_bytes'] / GIB:.2f} GiB | "
            f"{max(r['worker_peak_rss_bytes']) / GIB:.2f} GiB | {sel:.3f} | {pass_s:.3f} | "
            f"{len(r['rounds'])} | {sel * grow * waves:,.0f} s | {pass_s * grow * waves:,.0f} s |")
    cand = max(16, min(4096, CANDIDATES_TOTAL // shards))
    cap = candidate_cap(shards, d, cand)
    grown = min(8 * cand, cap)
    lines += ["", "Below ~10⁵ rows per shard a task's fixed cost (Ray's scheduling, reading the "
              "file) dominates, so the smaller runs overstate the extension; times are at the "
              "measured d and grow about linearly with d for the pass (a mat-vec per row).",
              "", f"At {shards:,} shards each shard sends {cand:,} candidates each way in the "
              f"first round ({CANDIDATES_TOTAL:,} rows each way in all, at least 16 a shard); a "
              "round that swaps most of its candidates doubles them, up to 8× and within "
              f"{CANDIDATE_BYTES / GIB:.0f} GiB of candidate rows on the coordinator (12·d + 24 "
              f"bytes a row, both ways). At d = {d} that is at most {grown:,} a shard, "
              f"{grown * shards:,} rows each way, "
              f"{2 * grown * shards * (12 * d + 24) / GIB:.1f} GiB."]
    return "\n".join(lines)


DEDUP_SCALE = REPO / "bench" / "results" / "results_dedup_scale.json"
# how each kind's work grows with N (rows), at a fixed cluster size for "near"
DEDUP_GROWTH = {"exact": "N (hash, then group by key)", "fuzzy": "N (signatures; group by band)",
                "near": "N·C·d to assign N rows to C = N/1,000 centroids, N·1,000·d inside clusters"}


def dedup_table(path=None, corpora=(1e8, 1e9)) -> str:
    """The measured 10^6-row deduplication per kind, and its core-hours at ``corpora`` rows:
    linear for exact and fuzzy, and for near with the centroid count held at the measured
    run's (what a two-level clustering keeps; the one-level k-means of this repository grows
    as N^2)."""
    p = Path(path or DEDUP_SCALE)
    if not p.exists():
        return "not measured (no results_dedup_scale.json in bench/results)"
    r = json.loads(p.read_text())
    n = r["rows"]
    head = " | ".join(f"core-hours at {c:.0e} rows" for c in corpora)
    lines = [f"| kind | seconds at {n:,} rows × {r['dim']} | grows as | {head} |",
             "|---|---:|---|" + "---:|" * len(corpora)]
    for kind, k in r["kinds"].items():
        cells = " | ".join(f"{k['seconds'] * c / n / 3600:,.1f}" for c in corpora)
        lines.append(f"| {kind} | {k['seconds']:.0f} | {DEDUP_GROWTH.get(kind, '?')} | {cells} |")
    lines.append(f"| (process peak RSS, corpus in memory) | {r['kinds']['near']['peak_rss_bytes'] / GIB:.2f} GiB | | "
                 + " | ".join("—" for _ in corpora) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=float, help="corpus rows N (e.g. 2e10)")
    ap.add_argument("--dim", type=int, default=768, help="embedding dimension d")
    ap.add_argument("--rows-per-shard", type=float, default=1e6)
    ap.add_argument("--rollouts", type=int, default=128, help="G (n_rollout)")
    ap.add_argument("--partial", type=float, default=0.1)
    ap.add_argument("--n-epochs", type=int, default=5000)
    ap.add_argument("--bench", default=None, help="glob of benchmark result files")
    args = ap.parse_args(argv)

    if args.rows:
        s = int(args.rows_per_shard)
        c = shard_count(args.rows, s)
        e = gpu_estimate(s, args.dim, args.rollouts, args.partial)
        print(f"corpus {args.rows:,.0f} rows at d={args.dim}, {s:,} rows per shard:")
        print(f"  shards (partitions, runs): {c:,}  -> {partition_verdict(c)}")
        print(f"  smallest shard keeping <= {COMFORTABLE_PARTITIONS:,} partitions: "
              f"{min_rows_per_shard(args.rows):,} rows")
        print(f"  GPU memory per mask pod: learning {_gib(e['learn_total_bytes'])} GiB, "
              f"peak {_gib(e['device_peak_bytes'])} GiB -> GPU of >= "
              f"{e['smallest_gpu_gib'] or '> 141'} GiB")
        print(f"  pod memory request (host): {_k8s_memory(e['host_bytes'])} "
              f"(DATAMASK_K8S_GPU_MEMORY)")
        gpu = [r for r in load_bench_rates(args.bench) if str(r.get("device", "")).startswith("cuda")]
        for r in gpu:
            print(f"  {r['file']}: {r['steps_per_s']:.3g} steps/s on {r['device']} "
                  f"(n={r.get('n', '?')}, d={r.get('d', '?')}) -> "
                  f"{gpu_hours_per_shard(r['steps_per_s'], args.n_epochs):.3g} h per shard")
        if not gpu:
            print("  GPU-hours per shard: not measured (no GPU run in bench/results)")
        for e in cpu_per_shard(solver_times(), s):
            if e["solver"] == "topk+polish":  # the pipeline's default (solver=auto) on CPU
                print(f"  CPU, topk+polish, {e['term']}: {e['seconds']:,.0f} s per shard "
                      f"({e['how']}, d={e['d']}, 1 thread)")
        return 0

    print("## Shards\n")
    print(shards_table())
    print("\n## Memory per mask pod (fp32)\n")
    print(memory_table())
    print("\n## Step rates\n")
    print(rates_table(load_bench_rates(args.bench), args.n_epochs))
    print("\n## CPU time and memory per shard\n")
    print(cpu_table())
    print("\n## One 10⁶-row shard through the pipeline, measured\n")
    print(large_shard_table())
    print("\n## File steps\n")
    print(io_table())
    print("\n## Embedding cost\n")
    print(embed_table())
    print("\n## The corpus stage\n")
    print(corpus_stage_table())
    print("\n## The corpus stage as Ray tasks\n")
    print(corpus_tasks_table())
    print("\n## Deduplication\n")
    print(dedup_table())
    return 0


if __name__ == "__main__":
    sys.exit(main())
