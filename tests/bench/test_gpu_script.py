"""bench/gpu.sh in its dry mode: the GPU script's own code on a tiny shard on the CPU, with
dagster and duckdb made unimportable (as on a GPU machine that lacks them). No timing is
asserted."""

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "gpu.sh"


def _blocker(tmp_path: Path) -> Path:
    """A folder whose ``dagster`` and ``duckdb`` packages refuse to import."""
    root = tmp_path / "blocked"
    for name in ("dagster", "duckdb"):
        (root / name).mkdir(parents=True)
        (root / name / "__init__.py").write_text(
            f"raise ImportError('{name} is not installed on the GPU machine')\n")
    return root


def _run(tmp_path, *args, **env_extra):
    env = dict(os.environ, OMP_NUM_THREADS="1", OUT=str(tmp_path / "out"),
               PYTHONPATH=str(_blocker(tmp_path)), **env_extra)
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_dry_run_is_engine_only_and_records_every_number(tmp_path):
    proc = _run(tmp_path, "--dry")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads((tmp_path / "out" / "results_gpu.json").read_text())
    assert res["dry"] is True and res["machine"]["device"] == "cpu"
    assert res["imported"] == {"dagster": False, "duckdb": False}
    s = res["settings"]
    # the paper's settings, as on the GPU; only n, d, steps and the polish cap are small
    assert s["G"] == 128 and 0.05 <= s["partial"] <= 0.1 and s["projected_steps"] == 5000
    assert s["facility_similarity"] in ("sparse", "dense")
    assert set(res["terms"]) == {"DiSF", "Pair_simi", "Facility"}
    for term, row in res["terms"].items():
        lr = row["learner"]
        assert lr["steps"] == s["steps"], term
        assert lr["steps_per_s"] > 0
        assert lr["projected_s_per_block"] == pytest.approx(lr["setup_s"] + 5000 / lr["steps_per_s"])
        ds = row["default_solver"]
        assert ds["solver"] == "auto" and ds["route"] and ds["wall_s"] > 0
        assert ds["f"] >= ds["f_topk"] - 1e-9  # the guard never returns less than top-k
    kinds = {k["bound"] for k in res["efficiency"]["kernels"]}
    assert kinds == {"compute", "memory"}
    for k in res["efficiency"]["kernels"]:
        frac = k.get("fraction_of_matmul", k.get("fraction_of_copy"))
        assert frac is not None and frac > 0, k


def test_dry_by_environment(tmp_path):
    proc = _run(tmp_path, DRY="1", TERMS="Pair_simi")
    assert proc.returncode == 0, proc.stderr[-3000:]
    res = json.loads((tmp_path / "out" / "results_gpu.json").read_text())
    assert res["dry"] is True and list(res["terms"]) == ["Pair_simi"]


def test_unknown_argument_is_refused(tmp_path):
    proc = _run(tmp_path, "--wet")
    assert proc.returncode == 2 and "unknown argument --wet" in proc.stderr


def test_without_cuda_the_real_run_refuses(tmp_path):
    proc = _run(tmp_path, CUDA_VISIBLE_DEVICES="", N="1000", D="8")
    assert proc.returncode == 2 and "CUDA is not available" in proc.stderr
