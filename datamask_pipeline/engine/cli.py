"""``train_mask`` / ``datamask``: the engine's command line, flag-compatible with upstream.

    train_mask --input in.parquet --output out.parquet --device cuda:0 \\
        --n_epochs 5000 --algorithm DiSF --partial 0.1 --max_lr 10 --min_lr 1 \\
        --n_rollout 128 --select_ratio 0.3 --init quality --lamb 0.5

Writes the selected rows (every input column) to ``--output`` atomically and prints a JSON
summary. Exit code 2 on bad input or configuration, with the reason on stderr.

A shard with a text column (``--text-column``, default ``text``) and no embedding column is
embedded first (``--embedding-model``, default ``wordllama``, offline); ``--write-embeddings``
adds the computed vectors to the output as ``--embedding-column``. A shard without its quality
column(s) but with the text column is scored from the text first (``--quality-scorer``, default
``heuristic``, offline; ``engine.quality``), so a bare parquet of id and text is selectable.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import typing

from .cli_flags import CommandLine, learner_config, number, whole
from .config import ConfigError, LearnerConfig, knob_flags, profile_defaults


def parse_terms(spec: str) -> dict:
    """``"DiSF=0.5,Pair_simi=1"`` -> {"DiSF": 0.5, "Pair_simi": 1.0}."""
    out = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, sep, w = part.partition("=")
        try:
            out[name.strip()] = float(w) if sep else 1.0
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--terms: {part!r} is not NAME=WEIGHT (e.g. DiSF=0.5,Pair_simi=1)") from None
    return out


def _knob_argument(group, name: str, info, default, shown=None) -> None:
    """One flag per knob, derived from LearnerConfig's field (type, choices, description).
    ``shown``: the default the help names (None: none; the flag's own default is SUPPRESS)."""
    ann = info.annotation
    args = typing.get_args(ann)
    # argparse %-formats help texts: a description's own '%' ("40-50%") must be escaped
    desc = (info.description or "").replace("%", "%%")
    kw: dict = {"default": default, "dest": name,
                "help": desc if shown is None else f"{desc} (default {shown})"}
    if typing.get_origin(ann) is typing.Literal:
        kw["choices"] = args
    elif name == "terms":
        kw["type"] = parse_terms
    else:
        base = next((a for a in args if a is not type(None)), ann) if args else ann
        kw["type"] = base
    group.add_argument(*knob_flags(name), **kw)


def add_knob_arguments(group, exclude=(), shown_profile: str | None = None) -> None:
    """A flag per LearnerConfig knob; a knob not given stays unset (the profile decides).
    ``shown_profile``: the profile whose values the help names as defaults (None: none)."""
    shown = profile_defaults(shown_profile) if shown_profile else None
    for name, info in LearnerConfig.model_fields.items():
        if name not in exclude:
            label = None
            if shown is not None:
                value = "unset" if shown[name] is None else shown[name]
                label = f"{value}; {shown_profile} profile"
            _knob_argument(group, name, info, argparse.SUPPRESS, shown=label)


def build_parser() -> argparse.ArgumentParser:
    p = CommandLine(
        "datamask_pipeline.engine.cli",
        description="DATAMASK: select a high-quality, diverse subset of a parquet shard. "
                    "Method knobs default to the 'upstream' profile (upstream's train_mask.py); "
                    "--profile pipeline gives the Dagster pipeline's defaults.",
    )
    up = p.add_argument_group("input and output")
    up.add_argument("--input", required=True, help="input parquet shard (path or URI)")
    up.add_argument("--output", required=True, help="output parquet of the selected rows")
    up.add_argument("--device", default="auto", help="auto | cpu | cuda:N (default auto)")
    knobs = p.add_argument_group("method knobs (engine.config.LearnerConfig)")
    knobs.add_argument("--profile", default="upstream",
                       help="defaults of every knob: upstream (default) or pipeline; explicit "
                            "flags override it")
    add_knob_arguments(knobs, shown_profile="upstream")
    ex = p.add_argument_group("data and run")
    ex.add_argument("--id-column", default=None,
                    help="the id column (default chunk_id; a file without one whose columns "
                         "include 'id' uses that, and says so)")
    ex.add_argument("--quality-column", action="append", default=None,
                    help="quality column (repeat to sum several; default quality_score)")
    ex.add_argument("--quality-weights", default=None,
                    help="comma-separated weights for the quality columns")
    ex.add_argument("--embedding-column", default="feature_arr")
    emb = p.add_argument_group("text-only shards (no embedding column)")
    emb.add_argument("--text-column", default="text",
                     help="text column embedded when the shard has no embedding column "
                          "(default text; '' requires embeddings)")
    emb.add_argument("--embedding-model", default="wordllama",
                     help="wordllama (default; ships in its package, offline; wordllama:128 or "
                          ":64 for fewer dimensions) or a sentence-transformers model name or "
                          "local directory")
    emb.add_argument("--embed-max-tokens", type=whole(1), default=None,
                     help="tokens embedded per text (per window with --embed-pooling chunks); "
                          "default: the model's limit (512 for wordllama)")
    emb.add_argument("--embed-pooling", default="truncate", choices=("truncate", "chunks"),
                     help="long texts: truncate at the token limit (default) or embed windows "
                          "and average them")
    emb.add_argument("--embed-checkpoint", default=None,
                     help="directory for the embedding chunks; a rerun reuses the chunks "
                          "already there (default: a temporary directory)")
    emb.add_argument("--write-embeddings", action="store_true",
                     help="add the computed embeddings to the output (as --embedding-column)")
    qs = p.add_argument_group("shards without a quality column (scored from the text)")
    qs.add_argument("--quality-scorer", default="heuristic",
                    help="heuristic (default; offline, CPU, a score in [0, 1]), "
                         "fasttext:/path/model.bin[#label], hf:/path/dir[#label], or several "
                         "comma-separated with =weight, summed; models are local paths, never "
                         "downloaded; '' requires the quality column")
    qs.add_argument("--quality-checkpoint", default=None,
                    help="directory for the quality score chunks; a rerun reuses the chunks "
                         "already there (default: a temporary directory)")
    ex.add_argument("--expected-dim", type=whole(1), default=None)
    ex.add_argument("--quality-min", type=number(), default=None,
                    help="declared lower bound of every quality column (inclusive); a shard "
                         "with a value below it breaks the data contract")
    ex.add_argument("--quality-max", type=number(), default=None,
                    help="declared upper bound of every quality column (inclusive)")
    ex.add_argument("--precision", default="fp32", choices=("fp32", "tf32", "bf16"))
    ex.add_argument("--threads", type=whole(0), default=0,
                    help="torch CPU threads (0, the default: the cores not already busy when "
                         "the run starts, from the load average; OMP_NUM_THREADS, when set, "
                         "is kept)")
    ex.add_argument("--checkpoint", default=None, help="checkpoint file (resumed if it matches)")
    ex.add_argument("--checkpoint-every", type=whole(1), default=100)
    ex.add_argument("--no-resume", action="store_true", help="ignore an existing checkpoint")
    ex.add_argument("--masks-output", default=None,
                    help="also write per-sample id, logit, rank, selected parquet")
    ex.add_argument("--summary-json", default=None, help="write the JSON summary here too")
    ex.add_argument("--progress-every", type=whole(1), default=None)
    ex.add_argument("--no-progress", action="store_true")
    return p


def config_from_args(args) -> LearnerConfig:
    """The knobs given on the command line over the chosen profile's defaults; a value that
    breaks a knob's rule raises ConfigError naming its flag."""
    given = {f: getattr(args, f) for f in LearnerConfig.model_fields if hasattr(args, f)}
    try:
        base = profile_defaults(args.profile)
    except ConfigError as exc:
        raise ConfigError(f"--profile {args.profile}: {exc}") from None
    return learner_config(base, given, lambda knob: knob_flags(knob)[0])


def quality_weights(args) -> tuple | None:
    """``--quality-weights`` as numbers, one per quality column (ConfigError otherwise)."""
    if not args.quality_weights:
        return None
    qcols = tuple(args.quality_column or ["quality_score"])
    try:
        weights = tuple(float(w) for w in args.quality_weights.split(","))
    except ValueError:
        raise ConfigError(f"--quality-weights {args.quality_weights}: expected comma-separated "
                          "numbers, one per --quality-column") from None
    if len(weights) != len(qcols):
        raise ConfigError(
            f"--quality-weights has {len(weights)} values for {len(qcols)} quality columns"
        )
    return weights


def check_args(args) -> LearnerConfig:
    """Every flag value checked before any work (reading, embedding, learning): the method
    knobs, the quality weights and range, and the id column of the input (detected as the
    demo detects it, ``engine.id_column``). Raises ConfigError naming the flag, or the data
    contract's error when the input has no id column; returns the knobs."""
    from .id_column import detect_id_column, file_columns
    from .storage import StorageError

    cfg = config_from_args(args)
    quality_weights(args)
    if (args.quality_min is not None and args.quality_max is not None
            and args.quality_min > args.quality_max):
        raise ConfigError(f"--quality-min {args.quality_min:g} is above --quality-max "
                          f"{args.quality_max:g}")
    try:
        names = file_columns(args.input)
    except (OSError, ValueError, StorageError):
        names = None  # an unreadable input: read_shard says why, in its own words
    if names is None:
        args.id_column = args.id_column or "chunk_id"
    else:  # IdColumnError: a DataContractError, reported like read_shard's
        args.id_column, note = detect_id_column(names, args.id_column, where=args.input)
        if note:
            print(f"train_mask: {note}", file=sys.stderr)
    return cfg


class ProgressBar:
    """The learner's progress as a tqdm bar on stderr, with the objective as its postfix.

    One ETA: the learner's own (its mean step rate since the start, evaluation excluded), in
    place of tqdm's smoothed one. The last step's line is drawn once, by ``close``."""

    # tqdm's default format without its own remaining-time estimate
    FORMAT = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}, {rate_fmt}{postfix}]"

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.bar = None
        self.closed = False

    def __call__(self, p) -> None:
        from tqdm import tqdm

        if self.closed:
            return
        if self.bar is None:
            self.bar = tqdm(total=p.n_steps, file=self.stream, desc="train_mask", unit="step",
                            mininterval=1.0, dynamic_ncols=True, bar_format=self.FORMAT)
        self.bar.set_postfix_str(
            f"lr={p.lr:.3g} f_mean={p.mean_f:.5g} f_best={p.best_f:.5g} "
            f"qua={p.mean_f_qua:.4g} div={p.mean_f_div:.4g} "
            f"eta={tqdm.format_interval(p.eta_s)}", refresh=False)
        if p.step >= p.n_steps:
            self.bar.n = p.step  # no refresh here: close() draws the final line, once
            self.bar.close()
            self.closed = True
        else:
            self.bar.update(p.step - self.bar.n)


def choose_threads(requested: int, environ=None, cores: int | None = None,
                   load: float | None = None) -> tuple[int | None, str]:
    """torch's CPU threads for this run and why: ``--threads N`` as given; OMP_NUM_THREADS or
    MKL_NUM_THREADS when set (None: leave torch as it is); else the cores not already busy,
    from the 1-minute load average (at least 1). Intra-op threads that wait for cores held by
    other processes make a run slower than fewer threads would (2.4x at 2 threads on a loaded
    2-core machine)."""
    if requested and requested > 0:
        return requested, "--threads"
    env = os.environ if environ is None else environ
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        if env.get(var):
            return None, f"{var}={env[var]}"
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
            os.cpu_count() or 1)
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (OSError, AttributeError):
            load = 0.0
    idle = max(1, min(cores, int(cores - load + 0.5)))
    return idle, f"{cores} cores, load average {load:.1f}"


def _fmt_seconds(s: float) -> str:
    if s < 1:
        return "under a second"
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def learning_cost(shard, cfg: LearnerConfig, device, dtype, probe_steps: int = 5) -> dict | None:
    """What the run's learner will cost, measured before it starts: ``probe_steps`` steps
    of the same configuration on the same device (their time, the first step's warm-up
    excluded) extrapolated to ``n_epochs``. None when the route runs no learning steps."""
    from .config import LEARNING_SOLVERS
    from .learner import learn
    from .select import route_for

    route, _ = route_for(cfg, shard.n, device)
    if route not in LEARNING_SOLVERS or cfg.lamb == 1.0:
        return None
    steps = min(cfg.n_epochs, max(2, probe_steps))
    seen = []
    learn(shard.embeddings, shard.quality, cfg, device=device, dtype=dtype, max_steps=steps,
          progress=lambda p: seen.append(p.elapsed_s), progress_every=1)
    per_step = (seen[-1] - seen[0]) / max(1, len(seen) - 1) if len(seen) > 1 else seen[-1]
    return {"route": route, "steps": cfg.n_epochs, "probe_steps": steps,
            "seconds_per_step": per_step, "learn_s": per_step * cfg.n_epochs}


def announce(shard, cfg: LearnerConfig, device, threads: tuple, dtype, stream=None) -> dict | None:
    """Tell the user, before the work starts, what the run is and what it will cost."""
    from .select import route_for

    stream = stream or sys.stderr
    sz = cfg.sizes(shard.n)
    route, _ = route_for(cfg, shard.n, device)
    n_threads, why = threads
    where = str(device)
    if device.type == "cpu":
        import torch

        where += f", {torch.get_num_threads() if n_threads is None else n_threads} torch thread(s) ({why})"
    print(f"train_mask: n={shard.n:,} d={shard.d} k={sz['k']:,}, {cfg.term_label}, solver "
          f"{cfg.solver} -> {route}, on {where}", file=stream)
    cost = learning_cost(shard, cfg, device, dtype)
    if cost is None:
        print("train_mask: no learning steps on this route (seconds to minutes of selection "
              "and polish, see docs/measured.md)", file=stream)
        return None
    print(f"train_mask: {cost['steps']:,} learning steps of {cfg.n_rollout} masks of "
          f"{sz['k_batch']:,} from batches of {sz['batch']:,} rows; "
          f"{cost['seconds_per_step']:.2g} s a step over a {cost['probe_steps']}-step probe: "
          f"about {_fmt_seconds(cost['learn_s'])} of learning"
          + (" plus the polish" if route.endswith("+polish") else ""), file=stream)
    if device.type == "cpu" and cost["learn_s"] > 120:
        print("train_mask: the learner is slow on CPU; faster here: --profile pipeline "
              "(solver auto, no learning steps) or fewer steps (--n_epochs 400 --n_rollout 64, "
              "the CPU demo preset)", file=stream)
    return cost


class EmbedProgressBar:
    """The embedding step's progress as a tqdm bar on stderr (rows)."""

    def __init__(self, stream=None):
        self.stream = stream or sys.stderr
        self.bar = None

    def __call__(self, p) -> None:
        from tqdm import tqdm

        if self.bar is None:
            self.bar = tqdm(total=p.rows, file=self.stream, desc="embed", unit="row",
                            mininterval=1.0, dynamic_ncols=True)
        self.bar.set_postfix_str(f"chunks {p.chunks_done}/{p.chunks} reused={p.reused}",
                                 refresh=False)
        self.bar.update(p.rows_done - self.bar.n)
        if p.rows_done >= p.rows:
            self.bar.close()


def _add_embeddings(output: str, shard, selected) -> None:
    """Rewrite ``output`` (the selected rows, in input order) with the computed embeddings as
    one more column, published atomically."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from . import storage

    fs, path = storage.resolve(output)
    with fs.open_input_file(path) as fh:
        table = pq.read_table(fh)
    x = shard.embeddings[selected]  # (k, d), input order like the output rows
    ids = table.column(shard.columns.id).to_numpy(zero_copy_only=False)
    if not np.array_equal(ids, shard.ids[selected]):
        raise RuntimeError(f"{output}: rows are not the selected ids in input order")
    col = pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), x.shape[1])
    storage.atomic_write_table(table.append_column(shard.columns.embedding, col), output)


def run(args, cfg: LearnerConfig | None = None) -> dict:
    import pyarrow as pa
    import torch

    from . import storage
    from .data import Columns, read_shard
    from .device import resolve_device
    from .select import select_shard

    t0 = time.perf_counter()
    if cfg is None:
        cfg = check_args(args)
    device = resolve_device(args.device)
    threads = (None, "CUDA run")
    if device.type == "cpu":
        threads = choose_threads(args.threads)
        if threads[0] is not None:
            torch.set_num_threads(threads[0])
    qcols = tuple(args.quality_column or ["quality_score"])
    weights = quality_weights(args)
    columns = Columns(id=args.id_column, quality=qcols, quality_weights=weights,
                      embedding=args.embedding_column, text=args.text_column or None,
                      quality_from_text=bool((args.quality_scorer or "").strip()))
    qrange = None
    if args.quality_min is not None or args.quality_max is not None:
        qrange = (args.quality_min, args.quality_max)

    def embedder():
        from .embed import load_embedder

        return load_embedder(args.embedding_model, max_tokens=args.embed_max_tokens,
                             pooling=args.embed_pooling,
                             device=None if device.type == "cpu" else str(device))

    def scorer():
        from .quality import load_scorer

        return load_scorer(args.quality_scorer,
                           device=None if device.type == "cpu" else str(device))

    shard = read_shard(args.input, columns=columns, expected_dim=args.expected_dim,
                       quality_range=qrange, embedder=embedder,
                       embed_checkpoint=args.embed_checkpoint,
                       embed_progress=None if args.no_progress else EmbedProgressBar(),
                       scorer=scorer, quality_checkpoint=args.quality_checkpoint)
    cfg.validate(shard.n)

    dtype = torch.float32
    if args.precision == "bf16":
        dtype = torch.bfloat16
    if args.precision == "tf32" and device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    if args.checkpoint and args.no_resume:
        storage.remove(args.checkpoint)
    resuming = bool(args.checkpoint) and storage.exists(args.checkpoint)
    if not args.no_progress and not resuming:
        announce(shard, cfg, device, threads, dtype)
    sel = select_shard(
        shard, cfg, device=device, dtype=dtype, checkpoint_path=args.checkpoint,
        checkpoint_every=args.checkpoint_every if args.checkpoint else 0,
        progress=None if args.no_progress else ProgressBar(), progress_every=args.progress_every,
    )
    written = storage.write_selected_rows(args.input, args.output, shard.ids[sel.selected],
                                          columns.id)
    if args.write_embeddings and shard.embedded is not None:
        _add_embeddings(args.output, shard, sel.selected)
    if args.masks_output:
        storage.atomic_write_table(
            pa.table({
                columns.id: pa.array(shard.ids),
                "logit": pa.array(sel.logits),
                "rank": pa.array(sel.rank),
                "selected": pa.array(sel.selected),
            }),
            args.masks_output,
        )
    return {
        "input": args.input,
        "output": args.output,
        "n": shard.n,
        "d": shard.d,
        "k": sel.k,
        "rows_written": written["rows"],
        "term": sel.term,
        "solver": sel.solver,
        "route": sel.route,
        "guard": sel.guard,
        "notes": sel.notes,
        "device": sel.device,
        "steps": sel.steps,
        "resumed_from": sel.resumed_from,
        "timings_s": {k: round(v, 3) for k, v in sel.timings.items()},
        "polish": sel.polish,
        "config": cfg.to_dict(),
        "config_hash": sel.config_hash,
        "objective": {"lamb": cfg.lamb, **{name: s.as_dict() for name, s in sel.scores.items()}},
        "embedding": None if shard.embedded is None else shard.embedded.metadata(),
        "quality": None if shard.scored is None else shard.scored.metadata(),
        "total_time_s": round(time.perf_counter() - t0, 3),
    }


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from .errors import DataContractError

    try:
        cfg = check_args(args)  # before torch and the data are loaded
    except (ConfigError, DataContractError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    import pickle

    from .device import DeviceError
    from .storage import StorageError

    try:
        summary = run(args, cfg)
    except (ConfigError, DeviceError, DataContractError, StorageError,
            pickle.UnpicklingError) as exc:  # UnpicklingError: an unsafe --checkpoint file
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    text = json.dumps(summary, indent=2, default=str)
    if args.summary_json:
        from . import storage

        storage.atomic_write_bytes(args.summary_json, text.encode())
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
