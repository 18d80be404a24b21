#!/usr/bin/env bash
# CUDA benchmark of DATAMASK on a 10^6-sample, 768-d block with the paper's settings.
#
#   bash bench/gpu.sh            # about 10 minutes on one GPU; results in bench/results/gpu/
#
# UNTESTED: written in a session without a GPU. It runs exactly the code paths of the CPU
# suite (python -m bench.run) with --device cuda; nothing here is CUDA-specific except the
# device flag. Each stage has its own time limit, and every stage rewrites its JSON after each
# (term, n) cell, so a stage cut short by its limit still leaves the cells it finished.
#
# Stage 1 (<= 4.7 min): n = 2*10^4 and 10^5 at d = 768 with greedy run (the n = 10^5 targets of
#   issue 4, measured on the GPU), the learner (G = 128, partial 0.1 / 0.05, 1000 steps) with
#   whole-shard evaluation of its read-out, paper+polish, plus the hardware section (matmul,
#   TF32 and bf16 peaks, memory copy, per-term kernels at n = 10^5).
# Stage 2 (<= 4.5 min, one process, the shard generated once): the 10^6 block: DiSF and pair-wise at partial 0.05 (batches of
#   50,000), facility location at partial 0.01 (its per-batch similarity matrix must fit the
#   2 GiB objective budget), G = 128, 1000 steps: steps/s, learner time, the projected time of
#   a 5,000-step run per 1M block (paper.projected_s in the JSON), polish, and greedy's time
#   extrapolated from stage 1's measured growth exponent.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-bench/results/gpu}
STEPS=${STEPS:-1000}
mkdir -p "$OUT"
"$PY" - <<'EOF' || { echo "gpu.sh: CUDA is not available to torch" >&2; exit 2; }
import torch, sys
sys.exit(0 if torch.cuda.is_available() else 1)
EOF
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv > "$OUT/nvidia-smi.csv" 2>&1 || true

echo "== stage 1: greedy-measured sizes (2e4, 1e5), d=768"
timeout 280 "$PY" -m bench.run --mode full --device cuda --dim 768 --sizes 20000,100000 \
  --steps "$STEPS" --rollouts 128 --partial 0.1 --max-batch 5000 --reps 1 --reps-small 1 \
  --greedy-max-n DiSF=100000 --greedy-max-n Facility=100000 --greedy-max-n Pair_simi=100000 \
  --polish-budget-s 60 --skip term_norm,speedups,pipeline --out "$OUT/stage1"
echo "stage 1 exit $?"

echo "== stage 2: the 10^6 block, d=768 (one process: the shard is generated once)"
PTS=()
[ -f "$OUT/stage1/results_full.json" ] && PTS=(--greedy-points-from "$OUT/stage1/results_full.json")
timeout 270 "$PY" -m bench.run --mode full --device cuda --dim 768 --sizes 1000000 \
  --terms DiSF,Pair_simi,Facility --steps "$STEPS" --rollouts 128 --partial 0.05 \
  --max-batch 50000 --max-batch-term Facility=10000 --reps 1 \
  --greedy-max-n DiSF=0 --greedy-max-n Pair_simi=0 --greedy-max-n Facility=0 \
  --polish-budget-s 40 "${PTS[@]}" --skip term_norm,speedups,pipeline,hardware --out "$OUT/block"
echo "stage 2 exit $?"
echo "reports: $OUT/stage1/REPORT.md $OUT/block/REPORT.md"
