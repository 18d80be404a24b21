"""``train_mask`` / ``datamask``: the engine's command line, flag-compatible with upstream.

    train_mask --input in.parquet --output out.parquet --device cuda:0 \\
        --n_epochs 5000 --algorithm DiSF --partial 0.1 --max_lr 10 --min_lr 1 \\
        --n_rollout 128 --select_ratio 0.3 --init quality --lamb 0.5

Writes the selected rows (every input column) to ``--output`` atomically and prints a JSON
summary. Exit code 2 on bad input or configuration, with the reason on stderr.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from .config import INITS, SOLVERS, TERM_NORMS, ConfigError, LearnerConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="train_mask",
        description="DATAMASK: select a high-quality, diverse subset of a parquet shard.",
    )
    up = p.add_argument_group("upstream flags")
    up.add_argument("--input", required=True, help="input parquet shard (path or URI)")
    up.add_argument("--output", required=True, help="output parquet of the selected rows")
    up.add_argument("--device", default="auto", help="auto | cpu | cuda:N (default auto)")
    up.add_argument("--n_epochs", type=int, default=5000, help="update steps")
    up.add_argument("--algorithm", default="DiSF", help="DiSF | Facility | Pair_simi")
    up.add_argument("--partial", type=float, default=0.1, help="batch fraction per step")
    up.add_argument("--max_lr", type=float, default=10.0)
    up.add_argument("--min_lr", type=float, default=1.0)
    up.add_argument("--n_rollout", type=int, default=128, help="rollouts G per step")
    up.add_argument("--select_ratio", type=float, default=0.1, help="fraction to keep")
    up.add_argument("--init", default="quality", choices=INITS)
    up.add_argument("--lamb", type=float, default=0.5, help="weight of quality (lambda)")
    ex = p.add_argument_group("extensions")
    ex.add_argument("--seed", type=int, default=0)
    ex.add_argument("--term_norm", "--term-norm", default="none", choices=TERM_NORMS)
    ex.add_argument("--solver", default=LearnerConfig.solver, choices=SOLVERS,
                    help="paper: the learner alone; paper+polish: then a swap local search "
                         "on the whole-shard objective (never lowers f)")
    ex.add_argument("--prune_ratio", "--prune-ratio", type=float, default=0.0,
                    help="drop this bottom fraction by quality before learning")
    ex.add_argument("--id-column", default="chunk_id")
    ex.add_argument("--quality-column", action="append", default=None,
                    help="quality column (repeat to sum several; default quality_score)")
    ex.add_argument("--quality-weights", default=None,
                    help="comma-separated weights for the quality columns")
    ex.add_argument("--embedding-column", default="feature_arr")
    ex.add_argument("--expected-dim", type=int, default=None)
    ex.add_argument("--quality-min", type=float, default=None,
                    help="declared lower bound of every quality column (inclusive); a shard "
                         "with a value below it breaks the data contract")
    ex.add_argument("--quality-max", type=float, default=None,
                    help="declared upper bound of every quality column (inclusive)")
    ex.add_argument("--precision", default="fp32", choices=("fp32", "tf32", "bf16"))
    ex.add_argument("--checkpoint", default=None, help="checkpoint file (resumed if it matches)")
    ex.add_argument("--checkpoint-every", type=int, default=100)
    ex.add_argument("--no-resume", action="store_true", help="ignore an existing checkpoint")
    ex.add_argument("--masks-output", default=None,
                    help="also write per-sample id, logit, rank, selected parquet")
    ex.add_argument("--summary-json", default=None, help="write the JSON summary here too")
    ex.add_argument("--progress-every", type=int, default=None)
    ex.add_argument("--no-progress", action="store_true")
    return p


class ProgressBar:
    """A one-line progress bar on stderr (plain log lines when stderr is not a terminal)."""

    def __init__(self, stream=None, width: int = 28):
        self.stream = stream or sys.stderr
        self.width = width
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def __call__(self, p) -> None:
        frac = p.step / max(1, p.n_steps)
        fill = int(round(frac * self.width))
        bar = "#" * fill + "-" * (self.width - fill)
        line = (
            f"[{bar}] {p.step}/{p.n_steps} lr={p.lr:.3g} f_mean={p.mean_f:.5g} "
            f"f_best={p.best_f:.5g} qua={p.mean_f_qua:.4g} div={p.mean_f_div:.4g} "
            f"elapsed={p.elapsed_s:.1f}s eta={p.eta_s:.1f}s"
        )
        if self.tty:
            self.stream.write("\r" + line + ("\n" if p.step >= p.n_steps else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def run(args) -> dict:
    import pyarrow as pa
    import torch

    from . import storage
    from .baselines import quality_topk, random_selection
    from .data import Columns, read_shard
    from .evaluate import evaluate_selection
    from .learner import learn, resolve_device

    t0 = time.perf_counter()
    cfg = LearnerConfig(
        algorithm=args.algorithm, lamb=args.lamb, select_ratio=args.select_ratio,
        n_epochs=args.n_epochs, n_rollout=args.n_rollout, partial=args.partial,
        max_lr=args.max_lr, min_lr=args.min_lr, init=args.init, prune_ratio=args.prune_ratio,
        term_norm=args.term_norm, seed=args.seed, solver=args.solver,
    )
    cfg.validate()
    device = resolve_device(args.device)
    qcols = tuple(args.quality_column or ["quality_score"])
    weights = None
    if args.quality_weights:
        weights = tuple(float(w) for w in args.quality_weights.split(","))
        if len(weights) != len(qcols):
            raise ConfigError(
                f"--quality-weights has {len(weights)} values for {len(qcols)} quality columns"
            )
    columns = Columns(id=args.id_column, quality=qcols, quality_weights=weights,
                      embedding=args.embedding_column)
    qrange = None
    if args.quality_min is not None or args.quality_max is not None:
        qrange = (args.quality_min, args.quality_max)
    shard = read_shard(args.input, columns=columns, expected_dim=args.expected_dim,
                       quality_range=qrange)
    cfg.validate(shard.n)

    dtype = torch.float32
    if args.precision == "bf16":
        dtype = torch.bfloat16
    if args.precision == "tf32" and device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    if args.checkpoint and args.no_resume:
        storage.remove(args.checkpoint)
    res = learn(
        shard.embeddings, shard.quality, cfg, ids=shard.ids, device=device, dtype=dtype,
        checkpoint_path=args.checkpoint, checkpoint_every=args.checkpoint_every if args.checkpoint else 0,
        progress=None if args.no_progress else ProgressBar(), progress_every=args.progress_every,
    )
    sel_ids = shard.ids[res.selected]
    written = storage.write_selected_rows(args.input, args.output, sel_ids, columns.id)
    if args.masks_output:
        storage.atomic_write_table(
            pa.table({
                columns.id: pa.array(shard.ids),
                "logit": pa.array(res.logits),
                "rank": pa.array(res.rank),
                "selected": pa.array(res.selected),
            }),
            args.masks_output,
        )
    k = int(res.selected.sum())
    ev = lambda sel: evaluate_selection(shard.embeddings, shard.quality, sel, lamb=cfg.lamb,
                                        terms=(cfg.algorithm,), device=device)
    summary = {
        "input": args.input,
        "output": args.output,
        "n": shard.n,
        "d": shard.d,
        "k": k,
        "rows_written": written["rows"],
        "algorithm": cfg.algorithm,
        "device": res.device,
        "steps": res.steps,
        "resumed_from": res.resumed_from,
        "learn_time_s": round(res.wall_time_s, 3),
        "polish": res.polish,
        "total_time_s": None,
        "config": cfg.to_dict(),
        "config_hash": res.config_hash,
        "objective": {
            "datamask": ev(res.selected_idx),
            "quality_topk": ev(quality_topk(shard.quality, k, shard.ids)),
            "random": ev(random_selection(shard.n, k, seed=cfg.seed)),
        },
    }
    summary["total_time_s"] = round(time.perf_counter() - t0, 3)
    return summary


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    import pickle

    from .data import DataContractError
    from .learner import DeviceError
    from .storage import StorageError

    try:
        summary = run(args)
    except (ConfigError, DeviceError, DataContractError, StorageError,
            pickle.UnpicklingError) as exc:  # UnpicklingError: an unsafe --checkpoint file
        print(f"train_mask: error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(summary, indent=2, default=str)
    if args.summary_json:
        from . import storage

        storage.atomic_write_bytes(args.summary_json, text.encode())
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
