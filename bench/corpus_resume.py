"""A corpus run KILLED on object storage resumes from its last round, measured.

The run's state (each shard's selected rows, the coordinator's round) lives on an S3 server
(moto's ThreadedMotoServer, in this process, reached over HTTP as a cluster reaches S3); the
shards are generated fp16 .npy files (bench.corpus_ray.generate, cut sorted by quality so the
exchange takes several rounds). Three child processes run the same selection:

1. killed: SIGKILL as soon as its log says round ``--kill-after-round`` finished;
2. resumed: the same arguments, the same checkpoint prefix (it must resume, not restart);
3. clean: a fresh checkpoint prefix, unbroken.

The resumed selection must equal the clean one in every shard, with the same rounds, k rows
in all and no row twice; the command exits 1 otherwise::

    python -m bench.corpus_resume --rows 1000000 --shards 100 --dim 16 --kill-after-round 2 \
        --tag corpus_resume
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid

import numpy as np

from bench.common import cpu_model, write_report

ROUND_RE = re.compile(r"corpus: exchange round (\d+):")  # engine/corpus/sharded.py, per round
RESUMED = ("from the checkpoint of an earlier attempt", "resuming the exchange after round")
ENV = {  # what tests/s3/conftest.py gives the pipeline (the endpoint is added at start)
    "AWS_ACCESS_KEY_ID": "datamask-bench", "AWS_SECRET_ACCESS_KEY": "datamask-bench-secret",
    "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
CLEARED = ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL_S3", "AWS_ROLE_ARN",
           "AWS_WEB_IDENTITY_TOKEN_FILE")


def child(a) -> int:
    """One selection run (a child process): every log line to stdout, the result to a.result."""
    import torch

    from bench.corpus_ray import generate, load_npy
    from datamask_pipeline.engine.config import LearnerConfig
    from datamask_pipeline.engine.corpus import CorpusBudget, CorpusShard, select_corpus

    torch.set_num_threads(1)  # the same arithmetic in every child
    bases = generate(a.workdir, a.rows, a.shards, a.dim, cut="sorted_by_quality")
    per = a.rows // a.shards
    cs = [CorpusShard(key=f"s{i:05d}", n=per, load=functools.partial(load_npy, b, i * per))
          for i, b in enumerate(bases)]
    cfg = LearnerConfig.profile("pipeline", algorithm="Pair_simi", lamb=0.5)
    t0 = time.perf_counter()
    sel = select_corpus(cs, cfg, CorpusBudget("fraction", 0.1), mode="exchange",
                        gather_max_rows=0, checkpoint_dir=a.checkpoint,
                        log=lambda m: print(m, flush=True))
    meta = {"wall_s": time.perf_counter() - t0, "k": sel.k, "rounds": len(sel.rounds),
            "converged": sel.converged, "f": sel.scores["selection"]["f"]}
    np.savez(a.result, meta=np.array(json.dumps(meta)), **sel.selected)
    return 0


def run_child(args: list, result: str, kill_after: int | None = None) -> dict:
    """Run a child to its end (or SIGKILL it once round ``kill_after`` is logged)."""
    cmd = [sys.executable, "-m", "bench.corpus_resume", "_child", *args, "--result", result]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         bufsize=1)
    lines, killed_at = [], None
    for line in p.stdout:
        lines.append(line.rstrip("\n"))
        print(f"  [{p.pid}] {lines[-1]}", flush=True)
        m = ROUND_RE.search(line)
        # the round file is written before this line is logged (sharded.py), so the state on
        # the bucket holds this round at the moment of the kill
        if kill_after is not None and killed_at is None and m and int(m.group(1)) >= kill_after:
            os.kill(p.pid, signal.SIGKILL)
            killed_at = time.perf_counter() - t0
    rc = p.wait()
    out = {"rc": rc, "process_s": time.perf_counter() - t0, "killed_at": killed_at, "log": lines,
           "rounds_run": [int(m.group(1)) for m in map(ROUND_RE.search, lines) if m]}
    if kill_after is None:
        if rc != 0:
            raise SystemExit(f"child failed (rc {rc}): {' '.join(cmd)}")
        with np.load(result) as z:
            out.update(json.loads(str(z["meta"])))
            out["selected"] = {k: z[k] for k in z.files if k != "meta"}
    return out


def markdown(r: dict) -> str:
    return "\n".join([
        f"{r['rows']:,} rows in {r['shards']} shards (fp16 .npy, cut sorted by quality), "
        f"{r['dim']}-d, Pair_simi, λ = 0.5, budget 10% (k = {r['k']:,}), exchange in-process; "
        f"checkpoints on S3 (moto server over HTTP); {r['cpu']}.", "",
        "| what | value |", "|---|---:|",
        f"| killed (SIGKILL) after round | {r['killed_after_round']} "
        f"({r['seconds_to_kill']:.1f} s after the child started) |",
        f"| S3 objects left under the checkpoint prefix | {r['s3_objects_left']} "
        f"(round file: round {r['checkpoint_round_left']}) |",
        f"| resumed run: rounds it ran / rounds in all | {r['resumed_rounds_run']} / "
        f"{r['rounds_total']} |",
        f"| resumed run wall (selection) | {r['resumed_wall_s']:.1f} s |",
        f"| clean run wall (selection) | {r['clean_wall_s']:.1f} s |",
        f"| resumed selection == clean, every shard; k rows, none twice | "
        f"{'yes' if r['identical'] else 'NO'} |"])


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    ap = argparse.ArgumentParser(prog="python -m bench.corpus_resume", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=float, default=1e6)
    ap.add_argument("--shards", type=int, default=100)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--kill-after-round", type=int, default=2)
    ap.add_argument("--workdir", default="/tmp/datamask-corpus-resume")
    ap.add_argument("--tag", default=None)
    ap.add_argument("--out", default="bench/results")
    if argv[:1] == ["_child"]:  # hidden: one selection run
        ap.add_argument("--checkpoint", required=True)
        ap.add_argument("--result", required=True)
        a = ap.parse_args(argv[1:])
        a.rows = int(a.rows)
        return child(a)
    a = ap.parse_args(argv)
    rows = int(a.rows)
    import logging
    import socket

    import moto.server
    import pyarrow.fs as pafs

    with socket.socket() as s:  # a port free a moment ago (as tests/s3/conftest.py)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = moto.server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # no line per request
    server.start()
    try:
        # the storage layer (and every child, which inherits this environment) reaches the
        # server through AWS_ENDPOINT_URL + the standard credential variables
        for name in CLEARED:
            os.environ.pop(name, None)
        os.environ.update(ENV, AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}")
        fs = pafs.S3FileSystem(endpoint_override=f"127.0.0.1:{port}", scheme="http",
                               region=ENV["AWS_REGION"], access_key=ENV["AWS_ACCESS_KEY_ID"],
                               secret_key=ENV["AWS_SECRET_ACCESS_KEY"],
                               allow_bucket_creation=True)
        bucket = f"datamask-bench-{uuid.uuid4().hex[:8]}"
        fs.create_dir(bucket)
        from bench.corpus_ray import generate

        generate(a.workdir, rows, a.shards, a.dim, cut="sorted_by_quality")  # once, not timed
        common = ["--rows", str(rows), "--shards", str(a.shards), "--dim", str(a.dim),
                  "--workdir", a.workdir]
        ckpt = f"s3://{bucket}/checkpoints/corpus"
        res = lambda name: os.path.join(a.workdir, f"result-{name}.npz")  # noqa: E731
        print(f"killed run (SIGKILL after round {a.kill_after_round})", flush=True)
        killed = run_child(common + ["--checkpoint", ckpt], res("killed"), a.kill_after_round)
        if killed["killed_at"] is None:
            raise SystemExit(f"the run ended (rc {killed['rc']}) before round "
                             f"{a.kill_after_round}: pick a larger corpus")
        left = [i for i in fs.get_file_info(pafs.FileSelector(f"{bucket}/checkpoints",
                                                              recursive=True))
                if i.type == pafs.FileType.File]
        round_file = next(i.path for i in left if i.path.endswith("/round.npz"))
        with fs.open_input_file(round_file) as fh:  # the round the killed run had saved
            ckpt_round = int(np.load(io.BytesIO(fh.read()))["round"])
        print(f"{len(left)} objects left, round file at round {ckpt_round}", flush=True)
        print("resumed run", flush=True)
        resumed = run_child(common + ["--checkpoint", ckpt], res("resumed"))
        print("clean run", flush=True)
        clean = run_child(common + ["--checkpoint", f"s3://{bucket}/checkpoints/clean"],
                          res("clean"))
        after = [i for i in fs.get_file_info(pafs.FileSelector(
            f"{bucket}/checkpoints", recursive=True, allow_not_found=True))
            if i.type == pafs.FileType.File]
    finally:
        server.stop()
    per = rows // a.shards
    sel_r, sel_c = resumed["selected"], clean["selected"]
    glob = np.concatenate([sel_r[key] + int(key[1:]) * per for key in sorted(sel_r)])
    checks = {
        "resumed": all(any(m in line for line in resumed["log"]) for m in RESUMED),
        "clean_started_fresh": not any(m in line for line in clean["log"] for m in RESUMED),
        "same_rows_every_shard": sel_r.keys() == sel_c.keys() and all(
            np.array_equal(sel_r[key], sel_c[key]) for key in sel_c),
        "same_rounds": resumed["rounds"] == clean["rounds"],
        "k_rows": glob.size == clean["k"] == resumed["k"],
        "no_row_twice": np.unique(glob).size == glob.size,
        "resumed_skipped_rounds": resumed["rounds_run"] == list(
            range(ckpt_round + 1, resumed["rounds"] + 1)),
        "state_removed_at_the_end": not after,
    }
    r = {"command": "python -m bench.corpus_resume " + " ".join(argv), "cpu": cpu_model(),
         "rows": per * a.shards, "shards": a.shards, "dim": a.dim, "k": clean["k"],
         "killed_after_round": a.kill_after_round, "seconds_to_kill": killed["killed_at"],
         "killed_rc": killed["rc"], "s3_objects_left": len(left),
         "s3_objects": sorted(i.path.split("/", 3)[-1] for i in left),
         "checkpoint_round_left": ckpt_round,
         "resumed_wall_s": resumed["wall_s"], "resumed_process_s": resumed["process_s"],
         "clean_wall_s": clean["wall_s"], "clean_process_s": clean["process_s"],
         "resumed_rounds_run": len(resumed["rounds_run"]),
         "rounds_total": clean["rounds"], "f_resumed": resumed["f"], "f_clean": clean["f"],
         "checks": checks, "identical": all(checks.values())}
    md = markdown(r)
    print(md)
    print(json.dumps(checks))
    if a.tag:
        write_report(a.out, a.tag, r, md)
    return 0 if r["identical"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
