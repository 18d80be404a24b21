#!/usr/bin/env bash
# One engine-only GPU benchmark of DATAMASK on a 10^6 x 768 shard, at most 5 minutes.
#
#   bash bench/gpu.sh                  # CUDA: 10^6 x 768, G = 128, partial 0.05 -> $OUT (bench/results/gpu)
#   DRY=1 bash bench/gpu.sh            # or: bash bench/gpu.sh --dry
#                                      #   1,000 x 16 on the CPU, 5 steps: the same code, seconds
#                                      #   (tests/bench/test_gpu_script.py runs it)
#
# Engine only: it imports datamask_pipeline.engine and bench.kernels / bench.common (torch,
# numpy, pyarrow, pydantic), never dagster or duckdb (the GPU machine may lack them; the run
# records what it imported and fails if either was). The device image of this workplace has
# torch, numpy and pyarrow but not pydantic: carry the wheels of pydantic, pydantic-core,
# annotated-types and typing-inspection (see the device notes) and put them on PYTHONPATH.
#
# Per diversity term (DiSF, Pair_simi, Facility), on one generated shard (engine/sample.py):
#   1. the learner at the paper's settings (G = 128, partial 0.05: batches of 50,000, masks
#      of 5,000) for STEPS steps: steps/s from the progress callbacks (steady state, set-up
#      excluded), set-up seconds, and the projected time of a 5,000-step run on this block
#      (set-up + 5,000 / steps/s);
#   2. the pipeline's default solver (solver=auto, what the Dagster mask asset runs), polish
#      capped at POLISH_S seconds: its route, time and whole-shard f next to quality top-k;
# then the efficiency fractions of bench/kernels.py (matmul / copy peaks of the device, each
# term's dominant kernel as a fraction of them) at the same batch sizes.
# The learner's Facility runs on the sparse (nearest-neighbour) similarity
# (LearnerConfig.facility_similarity="sparse"; on an engine without that knob, on the dense
# per-batch similarity with an objective budget, MEM_BUDGET_GIB, that holds 50,000^2 floats);
# results_gpu.json says which. The default solver runs the pipeline profile unchanged.
# The JSON is rewritten after every stage, so a run cut short by the time limit keeps what it
# finished. Knobs (environment): N, D, STEPS, G, PARTIAL, POLISH_S, MEM_BUDGET_GIB, LIMIT_S,
# TERMS, OUT, PY.
#
# Then (a separate process, SOLVERS_LIMIT_S, default 600 s; SOLVERS=0 skips it) it calibrates
# `solver: auto` for this device: `python -m bench.solvers --device cuda ... --write-table`
# measures every solver per term at SOLVER_SIZES (greedy, the reference, is skipped) and merges
# the CUDA rules into TABLE (default datamask_pipeline/engine/solver_table.json), keeping the
# CPU rules; results_solvers_gpu.json and REPORT_solvers_gpu.md land in $OUT, with a copy of the
# merged table. The dry run does the same on 1,500 rows on the CPU into $OUT/solver_table.json (a
# copy of the committed table), never into the committed one.
set -uo pipefail
cd "$(dirname "$0")/.."
DRY=${DRY:-0}
for arg in "$@"; do
  case "$arg" in
    --dry) DRY=1 ;;
    *) echo "gpu.sh: unknown argument $arg (only --dry)" >&2; exit 2 ;;
  esac
done
if [ -z "${PY:-}" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
if [ "$DRY" = 1 ]; then
  OUT=${OUT:-bench/results/tmp/gpu_dry}; LIMIT_S=${LIMIT_S:-120}
else
  OUT=${OUT:-bench/results/gpu}; LIMIT_S=${LIMIT_S:-300}
fi
mkdir -p "$OUT"
if [ "$DRY" != 1 ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/nvidia-smi.csv" 2>&1 || true
fi
export DRY OUT PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
timeout --signal=TERM --kill-after=10 "$LIMIT_S" "$PY" - <<'EOF'
import json, os, platform, sys, time, traceback
from types import SimpleNamespace

t_start = time.perf_counter()
DRY = os.environ.get("DRY") == "1"
OUT = os.environ["OUT"]
env = lambda k, v: type(v)(os.environ.get(k, v))  # noqa: E731
N = env("N", 1_000 if DRY else 1_000_000)
D = env("D", 16 if DRY else 768)
STEPS = env("STEPS", 5 if DRY else 200)
G = env("G", 128)
PARTIAL = env("PARTIAL", 0.05)
POLISH_S = env("POLISH_S", 1.0 if DRY else 25.0)
MEM_BUDGET_GIB = env("MEM_BUDGET_GIB", 1.0 if DRY else 24.0)
TERMS = [t for t in os.environ.get("TERMS", "DiSF,Pair_simi,Facility").split(",") if t]
EPOCHS = 5000  # the paper's step count: the projection target


def log(msg):
    print(f"[{time.perf_counter() - t_start:7.1f}s] {msg}", flush=True)


import numpy as np
import torch

from bench import common, kernels
from datamask_pipeline.engine.config import LearnerConfig
from datamask_pipeline.engine.learner import learn
from datamask_pipeline.engine.select import select_shard

if not DRY and not torch.cuda.is_available():
    print("gpu.sh: CUDA is not available to torch (DRY=1 runs the same code on the CPU)", file=sys.stderr)
    sys.exit(2)
dev = torch.device("cpu" if DRY else "cuda")
budget = int(MEM_BUDGET_GIB * 2**30)


def machine() -> dict:
    """common.machine_info without its optional dagster probe (this run must not import it)."""
    import pyarrow

    info = {"platform": platform.platform(), "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "cpu_model": common.cpu_model(),
            "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "numpy": np.__version__, "pyarrow": pyarrow.__version__, "device": str(dev),
            "loadavg_start": common.loadavg()}
    if dev.type == "cuda":
        info.update(cuda_device=torch.cuda.get_device_name(dev), cuda_version=torch.version.cuda)
    return info


sparse_knob = "facility_similarity" in LearnerConfig.model_fields
res = {"schema_version": 1, "dry": DRY,
       "command": ("DRY=1 " if DRY else "") + "bash bench/gpu.sh",
       "settings": {"n": N, "d": D, "steps": STEPS, "G": G, "partial": PARTIAL,
                    "polish_budget_s": POLISH_S, "mem_budget_gib": MEM_BUDGET_GIB,
                    "terms": TERMS, "projected_steps": EPOCHS,
                    "facility_similarity": "sparse" if sparse_knob else "dense"},
       "machine": machine(), "terms": {}, "notes": []}


def write():
    res["machine"]["loadavg_end"] = common.loadavg()
    res["total_s"] = time.perf_counter() - t_start
    res["imported"] = {m: m in sys.modules for m in ("dagster", "duckdb")}
    if dev.type == "cuda":
        res["machine"]["cuda_max_memory_allocated_gib"] = torch.cuda.max_memory_allocated(dev) / 2**30
    tmp = os.path.join(OUT, "results_gpu.json.tmp")
    with open(tmp, "w") as fh:
        json.dump(res, fh, indent=1, default=float)
    os.replace(tmp, os.path.join(OUT, "results_gpu.json"))


def config(term, **extra):
    kw = dict(algorithm=term, n_rollout=G, partial=PARTIAL, n_epochs=STEPS, **extra)
    if term == "Facility" and sparse_knob:
        kw["facility_similarity"] = "sparse"
    return LearnerConfig(**kw)


log(f"generating {N:,} x {D} (engine/sample.py) on {dev}")
with common.Timer() as t:
    x, q, ids = common.sample_data(N, D, seed=0)
res["generate_s"] = t.wall
write()

# warm-up: first calls of every kernel (CUDA context, cuBLAS handles), not timed
xw, qw, _ = common.sample_data(600, D, seed=1)
for term in TERMS:
    learn(xw, qw, LearnerConfig(algorithm=term, n_epochs=3, n_rollout=8, partial=0.5), device=dev)

try:
    log("efficiency: device peaks and each term's kernels at the learner's batch sizes")
    pk = kernels.peaks(dev, quick=DRY)
    res["efficiency"] = {"peaks": pk, "kernels": kernels.kernels(
        x, q, dev, G=G, partial=PARTIAL, select_ratio=0.1, peak=pk)}
except Exception as exc:
    res["efficiency"] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
    log(f"efficiency failed: {exc}")
write()
for term in TERMS:
    row = res["terms"].setdefault(term, {})
    try:
        cfg = config(term)
        stamps = []

        def on_progress(p, stamps=stamps):
            stamps.append((p.step, time.perf_counter()))

        log(f"{term}: learner, {STEPS} steps, G={G}, partial={PARTIAL} {cfg.sizes(N)}")
        with common.Timer(dev) as t:
            r = learn(x, q, cfg, ids=ids, device=dev, mem_budget=budget, progress=on_progress,
                      progress_every=max(1, STEPS // 10))
        (s0, t0), (s1, t1) = stamps[0], stamps[-1]
        rate = (s1 - s0) / (t1 - t0) if s1 > s0 and t1 > t0 else r.steps / t.wall
        setup = max(0.0, t.wall - r.steps / rate)
        row["learner"] = {"steps": int(r.steps), "wall_s": t.wall, "cpu_s": t.cpu,
                          "steps_per_s": rate, "setup_s": setup,
                          "projected_s_per_block": setup + EPOCHS / rate,
                          "sizes": cfg.sizes(N), "device": str(dev), "n": N, "d": D, "G": G,
                          "partial": PARTIAL}
        log(f"{term}: {rate:.3g} steps/s -> {EPOCHS} steps on this block ≈ "
            f"{row['learner']['projected_s_per_block']:.0f} s")
    except Exception as exc:  # a term that fails (memory ...) must not lose the others
        row["learner"] = {"error": f"{type(exc).__name__}: {exc}", "trace": traceback.format_exc()[-2000:]}
        log(f"{term}: learner failed: {exc}")
    write()
for term in TERMS:  # the default solvers last: a polish round can outlast its budget
    row = res["terms"][term]
    try:
        cfg = LearnerConfig.profile("pipeline", algorithm=term)  # as the mask asset runs it
        log(f"{term}: the pipeline's default solver ({cfg.solver}), polish ≤ {POLISH_S:g} s")
        shard = SimpleNamespace(embeddings=x, quality=q, ids=ids)
        with common.Timer(dev) as t:
            sel = select_shard(shard, cfg, device=dev, mem_budget=budget,
                               polish_time_budget_s=POLISH_S, references=False)
        sc = {k: v.as_dict() for k, v in sel.scores.items()}
        row["default_solver"] = {
            "solver": cfg.solver, "route": sel.route, "wall_s": t.wall, "timings": sel.timings,
            "f": sc["selection"]["f"], "f_topk": sc["quality_topk"]["f"],
            "polish": {k: v for k, v in (sel.polish or {}).items() if isinstance(v, (int, float, bool, str))},
            "guard": sel.guard, "notes": sel.notes}
        log(f"{term}: {sel.route} in {t.wall:.1f} s, f {sc['selection']['f']:.6f} "
            f"(top-k {sc['quality_topk']['f']:.6f})")
    except Exception as exc:
        row["default_solver"] = {"error": f"{type(exc).__name__}: {exc}",
                                 "trace": traceback.format_exc()[-2000:]}
        log(f"{term}: default solver failed: {exc}")
    write()

bad = [m for m, on in res["imported"].items() if on]
if bad:
    print(f"gpu.sh: the engine-only run imported {bad}", file=sys.stderr)
    sys.exit(3)
failed = [f"{t}.{k}" for t, row in res["terms"].items() for k, v in row.items() if "error" in v]
failed += ["efficiency"] if "error" in res["efficiency"] else []
log(f"wrote {OUT}/results_gpu.json" + (f"; failed: {failed}" if failed else ""))
sys.exit(4 if failed else 0)
EOF
rc=$?
[ "$rc" = 124 ] && echo "gpu.sh: cut at ${LIMIT_S}s; $OUT/results_gpu.json holds the stages that finished" >&2
[ "$rc" = 2 ] && exit "$rc"  # no CUDA: nothing to calibrate either

# auto's table for this device: measured here, merged into TABLE (the other devices' rules kept)
if [ "${SOLVERS:-1}" = 1 ]; then
  if [ "$DRY" = 1 ]; then
    TABLE=${TABLE:-$OUT/solver_table.json}
    [ -f "$TABLE" ] || cp datamask_pipeline/engine/solver_table.json "$TABLE"
    SOLVERS_ARGS=(--quick --terms "${TERMS:-DiSF,Pair_simi,Facility}")  # n = 1,500, d = 16
    SOLVERS_LIMIT_S=${SOLVERS_LIMIT_S:-120}
  else
    TABLE=${TABLE:-datamask_pipeline/engine/solver_table.json}
    SOLVERS_ARGS=(--device cuda --sizes "${SOLVER_SIZES:-5000,20000,100000}" --reps 1
                  --terms "${TERMS:-DiSF,Pair_simi,Facility}"
                  --greedy-max-n DiSF=0 --greedy-max-n Facility=0 --greedy-max-n Pair_simi=0)
    SOLVERS_LIMIT_S=${SOLVERS_LIMIT_S:-600}
  fi
  timeout --signal=TERM --kill-after=10 "$SOLVERS_LIMIT_S" "$PY" -m bench.solvers "${SOLVERS_ARGS[@]}" \
    --out "$OUT" --tag solvers_gpu --write-table --table "$TABLE"
  src=$?
  if [ "$src" = 0 ]; then
    [ "$TABLE" -ef "$OUT/solver_table.json" ] || cp "$TABLE" "$OUT/solver_table.json"
    echo "gpu.sh: auto's table for this device merged into $TABLE" >&2
  else
    echo "gpu.sh: bench.solvers exited $src; $TABLE is unchanged" >&2
    [ "$rc" = 0 ] && rc=5
  fi
fi
exit "$rc"
