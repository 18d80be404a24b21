"""bench.corpus_resume: a corpus run SIGKILLed with its checkpoints on S3 (moto's server)
resumes from its last round and selects what an unbroken run selects; the committed results
say so, their report is the one they render to, and the bench runs end to end at a tiny size."""

import json
import subprocess
import sys
from pathlib import Path

from bench.corpus_resume import markdown

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "bench" / "results"


def test_committed_results_show_a_killed_run_resumed_identically():
    r = json.loads((RESULTS / "results_corpus_resume.json").read_text())
    assert r["identical"] is True and all(r["checks"].values())
    assert r["killed_after_round"] >= 1 and r["checkpoint_round_left"] >= r["killed_after_round"]
    assert r["resumed_rounds_run"] < r["rounds_total"]
    assert r["resumed_rounds_run"] == r["rounds_total"] - r["checkpoint_round_left"]
    assert r["s3_objects_left"] > 0 and any(o.endswith("round.npz") for o in r["s3_objects"])
    assert r["command"].startswith("python -m bench.corpus_resume ")
    report = (RESULTS / "REPORT_corpus_resume.md").read_text()
    assert report == f"# corpus_resume\n\nCommand: `{r['command']}`\n\n{markdown(r)}\n"


def test_the_bench_kills_resumes_and_compares_at_a_tiny_size(tmp_path):
    out = tmp_path / "out"
    p = subprocess.run(
        [sys.executable, "-m", "bench.corpus_resume", "--rows", "20000", "--shards", "8",
         "--kill-after-round", "2", "--workdir", str(tmp_path / "w"), "--out", str(out),
         "--tag", "tiny"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    r = json.loads((out / "results_tiny.json").read_text())
    assert r["identical"] is True and r["k"] == 2000
    assert r["checkpoint_round_left"] == 2 and r["resumed_rounds_run"] == r["rounds_total"] - 2
    assert r["s3_objects_left"] > 0 and r["checks"]["state_removed_at_the_end"]
    assert (out / "REPORT_tiny.md").read_text().endswith(markdown(r) + "\n")
