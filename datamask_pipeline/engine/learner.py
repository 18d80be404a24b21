"""Policy-gradient mask learning (docs/method.md#learner).

One logit per sample. Each step draws a fresh random batch B of ``partial * pool`` samples,
samples G exact-k' masks from softmax(L_B) with the Gumbel-top-k trick, scores every mask with
the joint objective on B, and moves the logits by the group-normalised advantage:

    L_B <- L_B + (lr / G) * A^T M

which is a single scatter-add (no autograd). The learning rate falls linearly from ``max_lr``
to ``min_lr``. The read-out is the top-k by final logit, ties broken by id.
"""

from __future__ import annotations

import hashlib
import math
import pickle
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from .config import ConfigError, LearnerConfig
from .device import DeviceError, device_memory, resolve_device  # noqa: F401 (re-exported)
from .ranking import order_by, quality_pool, ranks, readout
from .objectives import Batch, default_mem_budget, score, tensor_of

CHECKPOINT_FORMAT = 1


@dataclass
class Progress:
    step: int
    n_steps: int
    lr: float
    mean_f: float
    best_f: float
    mean_f_qua: float
    mean_f_div: float
    elapsed_s: float
    eta_s: float

    def as_dict(self) -> dict:
        return dict(self.__dict__)


@dataclass
class LearnResult:
    selected: np.ndarray  # bool (n,)
    logits: np.ndarray  # float32 (n,)
    rank: np.ndarray  # int64 (n,), 0 = best
    history: list = field(default_factory=list)
    steps: int = 0
    wall_time_s: float = 0.0
    device: str = "cpu"
    resumed_from: int | None = None
    config_hash: str = ""
    sizes: dict = field(default_factory=dict)

    @property
    def selected_idx(self) -> np.ndarray:
        return np.flatnonzero(self.selected)


# ---------------------------------------------------------------- helpers
def estimate_memory(
    n: int, d: int, cfg: LearnerConfig, device: torch.device | str = "cpu",
    itemsize: int = 4, mem_budget: int | None = None, learning: bool = True,
    resident_bytes: int = 0,
) -> dict:
    """Pre-flight estimate of peak bytes for a run; raises ConfigError when it cannot fit.

    With ``learning`` (the learner runs): the resident embeddings and quality, the logits, one
    batch copy, the (G, m) Gumbel keys and the (G, k') masks, and the objective's working
    memory (bounded by mem_budget). Without: the embeddings, the whole-shard working copy the
    terms keep (unit rows or DiSF's frame, facility's similarity: the n x n matrix or the
    sparse neighbour graph) and the bounded working memory of greedy / polish. With learning,
    facility's whole-shard similarity (the evaluation's) is counted as its own part.
    ``resident_bytes``: what the caller already holds of these parts on this device (the
    loaded embeddings on CPU); it is counted in the estimate and so added to what is available.
    """
    device = resolve_device(device)
    budget = mem_budget or default_mem_budget(device)
    if learning:
        sz = cfg.sizes(n, learning=True)
        m, kb, G = sz["batch"], sz["k_batch"], cfg.n_rollout
        parts = {
            "embeddings": n * d * itemsize,
            "logits": 2 * n * 4,
            "batch_copy": 2 * m * d * 4,
            "gumbel_keys": 2 * G * m * 4,
            "masks": G * kb * 8 * 2,
            "objective_workspace": cfg.diversity_term(whole_shard=False).workspace_bytes(
                m, kb, d, 4, budget),
        }
        fac = _facility_part(cfg)
        if fac is not None:
            parts["facility_similarity"] = fac.similarity_bytes(n, d, 4, budget, device)
    else:
        k = cfg.sizes(n, learning=False)["k"]
        parts = {
            "embeddings": n * d * itemsize,
            "logits": 2 * n * 4,
            "objective_workspace": cfg.diversity_term().workspace_bytes(n, k, d, 4, budget),
        }
    total = int(sum(parts.values()))
    avail = device_memory(device) + int(resident_bytes)
    out = {"total_bytes": total, "available_bytes": avail, "parts": parts}
    fac = _facility_part(cfg)
    if fac is not None:
        out["facility_similarity"] = fac.mode(n, 4, budget)
    if total > avail:
        biggest = max(parts, key=parts.get)
        if fac is not None and out["facility_similarity"] == "dense":
            # dense facility holds n x n: say what the sparse similarity would need instead
            from .terms.facility import FacilityLocation

            sp = FacilityLocation("sparse", fac.neighbors, fac.knn)
            alt = (total - fac.similarity_bytes(n, d, 4, budget, device)
                   + sp.similarity_bytes(n, d, 4, budget, device))
            raise ConfigError(
                f"estimated peak memory {total / 2**30:.2f} GiB exceeds the "
                f"{avail / 2**30:.2f} GiB available on {device}: dense facility location holds "
                f"the {n} x {n} similarity ({n * n * 4 / 2**30:.2f} GiB); "
                f"facility_similarity='sparse' with facility_neighbors={fac.neighbors} needs "
                f"{alt / 2**30:.2f} GiB")
        knob = {
            "embeddings": "shard size (split the shard into more partitions) or precision",
            "gumbel_keys": "n_rollout or partial",
            "batch_copy": "partial",
            "masks": "n_rollout or partial",
            "objective_workspace": "the objective memory budget (mem_budget)",
            "logits": "shard size",
            "facility_similarity": "facility_neighbors or the shard size",
        }[biggest]
        raise ConfigError(
            f"estimated peak memory {total / 2**30:.2f} GiB exceeds the {avail / 2**30:.2f} GiB "
            f"available on {device}; largest part is {biggest} "
            f"({parts[biggest] / 2**30:.2f} GiB): lower {knob}"
        )
    return out


def _facility_part(cfg: LearnerConfig):
    """The whole-shard facility term of ``cfg`` (alone or in a mixture), or None."""
    from .terms.facility import facility_part

    return facility_part(cfg.diversity_term())


def check_quality_scale(q, dtype: torch.dtype = torch.float32) -> None:
    """Pre-flight: raise ConfigError when the quality scores are so large that a sum of n of
    them (the objective averages quality over masks and over the whole selection) overflows
    the learner's ``dtype`` arithmetic: the learner would silently produce Inf scores and NaN
    logits. Legal but huge scores must be scaled down first (quality weights)."""
    q = np.asarray(q.detach().cpu().double() if isinstance(q, torch.Tensor) else q, dtype=np.float64)
    if q.size == 0:
        return
    qmax = float(np.abs(q).max())
    limit = float(torch.finfo(dtype).max)
    if not math.isfinite(qmax) or qmax * q.size > limit:
        raise ConfigError(
            f"quality scores up to |q| = {qmax:.6g} overflow {str(dtype).replace('torch.', '')} "
            f"arithmetic when {q.size} of them are summed (limit |q| * n <= {limit:.3g}): scale "
            "them down with the quality weights (--quality-weights / DataContract.quality_weights) "
            "or normalise the quality column(s)"
        )


def initial_logits(q: torch.Tensor, init: str) -> torch.Tensor:
    if init == "same":
        return torch.zeros_like(q, dtype=torch.float32)
    qmin, qmax = q.min(), q.max()
    span = (qmax - qmin).clamp(min=1e-12)
    qt = (q - qmin) / span + 1e-3
    return qt.log().to(torch.float32)


def _fingerprint(x: torch.Tensor, q: torch.Tensor) -> str:
    h = hashlib.sha256()
    h.update(str(tuple(x.shape)).encode())
    h.update(np.float64(q.double().sum().item()).tobytes())
    h.update(np.float64(x.double().sum().item()).tobytes())
    h.update(np.float64(x[:, 0].double().abs().sum().item()).tobytes())
    return h.hexdigest()[:16]


HISTORY_KEYS = ("step", "lr", "mean_f", "best_f", "mean_f_qua", "mean_f_div", "elapsed_s")


def save_checkpoint(path: str, state: dict) -> None:
    """Atomic: write a temp file beside the target, fsync, rename."""
    import io

    from . import storage

    buf = io.BytesIO()  # torch.save needs a seekable file; object-store streams are not
    torch.save(state, buf)
    storage.atomic_write_bytes(path, buf.getvalue())


def load_checkpoint(path: str) -> dict | None:
    from . import storage

    if not storage.exists(path):
        return None
    import io

    fs, p = storage.resolve(path)
    with fs.open_input_stream(p) as fh:
        buf = io.BytesIO(fh.read())
    # weights_only: tensors, numbers, strings and containers only; no code runs on load.
    try:
        return torch.load(buf, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        why = next((ln for ln in lines if "GLOBAL" in ln), lines[0] if lines else "")
        raise pickle.UnpicklingError(
            f"checkpoint {path}: refused by the weights-only loader: it holds objects other "
            f"than tensors and plain data, which could run code when loaded ({why}); delete "
            "it to start from scratch"
        ) from exc


def sample_masks(logits_b: torch.Tensor, G: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """G exact-k masks drawn without replacement from softmax(logits_b), as a (G, k) index
    tensor: Gumbel-top-k (the k largest of logits + Gumbel(0, 1) noise, -log(Exp(1))).
    Exp(1) is drawn as -log(U), U uniform: the same distribution as ``exponential_`` and about
    7x faster on CPU (bench/: "make it fast")."""
    u = torch.empty((G, logits_b.numel()), device=logits_b.device, dtype=torch.float32)
    u.uniform_(generator=gen).clamp_(min=torch.finfo(torch.float32).tiny)
    keys = logits_b.unsqueeze(0) - u.log_().neg_().log_()
    return keys.topk(k, dim=1, sorted=False).indices


def advantages(f: torch.Tensor) -> torch.Tensor | None:
    """Group-normalised advantages (f - mean) / (std + 1e-8) over the G rollouts, or None when
    every rollout ties (nothing to learn from: the step is skipped)."""
    std = f.std(unbiased=False)
    if not float(std) > 1e-12 * max(1.0, float(f.abs().max())):
        return None
    return (f - f.mean()) / (std + 1e-8)


def policy_step(logits: torch.Tensor, B: torch.Tensor, idx: torch.Tensor, f: torch.Tensor,
                lr: float) -> bool:
    """One policy-gradient update in place (docs/method.md#learner):

        L_B <- L_B + (lr / G) * A^T M,   M in {0, 1}^(G x |B|), A = advantages(f)

    ``B``: the batch's row indices into ``logits``; ``idx`` (G, k'): each mask's positions in
    B. Only the batch's logits move. Returns False when the rollouts tie (no update). On CPU the
    sum is a scatter-add in a fixed order; on CUDA, where ``index_add_`` accumulates with
    atomics in arbitrary order, it is the product A^T M of a dense (G, |B|) mask, so that the
    same seed gives the same logits on the same device."""
    adv = advantages(f)
    if adv is None:
        return False
    G, kb = idx.shape
    w = adv * (lr / G)
    if logits.device.type == "cuda":
        M = torch.zeros((G, B.numel()), dtype=w.dtype, device=w.device).scatter_(1, idx, 1.0)
        logits.index_copy_(0, B, logits.index_select(0, B) + w @ M)
    else:
        logits.index_add_(0, B[idx.reshape(-1)], w.repeat_interleave(kb))
    return True


# ------------------------------------------------------------------ learner
def learn(
    x,
    q,
    cfg: LearnerConfig,
    *,
    ids=None,
    device: str | torch.device = "auto",
    dtype: torch.dtype = torch.float32,
    checkpoint_path: str | None = None,
    checkpoint_every: int = 0,
    progress: Callable[[Progress], None] | None = None,
    progress_every: int | None = None,
    mem_budget: int | None = None,
    on_eval: Callable[[int, np.ndarray, float], None] | None = None,
    eval_every: int = 0,
    max_steps: int | None = None,
) -> LearnResult:
    """Learn a selection of k = round(select_ratio * n) samples.

    ``x``: (n, d) embeddings, ``q``: (n,) quality (numpy or torch). ``ids`` orders ties in the
    read-out. With ``checkpoint_path`` the logits, step, history and RNG state are saved every
    ``checkpoint_every`` steps and a matching checkpoint is resumed from. ``on_eval(step,
    selected_idx, learner_elapsed_s)`` is called every ``eval_every`` steps with the current
    read-out (its own time is not counted in elapsed). ``max_steps`` stops early (used to
    simulate interruption in tests; the lr schedule still spans ``n_epochs``).
    """
    t_start = time.perf_counter()
    dev = resolve_device(device)
    x = tensor_of(x)
    q = tensor_of(q)
    if x.ndim != 2 or q.ndim != 1 or x.shape[0] != q.shape[0]:
        raise ValueError(f"x must be (n, d) and q (n,), got {tuple(x.shape)} and {tuple(q.shape)}")
    n, d = x.shape
    sz = cfg.sizes(n, learning=True)
    check_quality_scale(q, dtype)
    estimate_memory(n, d, cfg, dev, itemsize=torch.finfo(dtype).bits // 8, mem_budget=mem_budget)
    k, m, kb, G, T = sz["k"], sz["batch"], sz["k_batch"], cfg.n_rollout, cfg.n_epochs
    every = progress_every or max(1, T // 100)

    # Embeddings are stored at ``dtype`` (bf16 halves their memory); every batch is scored in
    # float32 (tests/engine/test_precision.py bounds bf16's error against fp32).
    x = x.to(device=dev, dtype=dtype)
    q_np = q.double().numpy() if q.device.type == "cpu" else q.double().cpu().numpy()
    q = q.to(device=dev, dtype=torch.float32)
    term = cfg.diversity_term(whole_shard=False)  # batch-local: facility stays dense
    pool = torch.as_tensor(quality_pool(q_np, cfg.prune_ratio, ids), device=dev)
    P = pool.numel()

    gen = torch.Generator(device=dev)
    gen.manual_seed(int(cfg.seed))
    logits = torch.full((n,), -math.inf, dtype=torch.float32, device=dev)
    logits[pool] = initial_logits(q[pool].float(), cfg.init)
    history: list[dict] = []
    start_step = 0
    resumed_from = None
    fingerprint = _fingerprint(x, q)
    chash = cfg.config_hash()

    if checkpoint_path:
        ck = load_checkpoint(checkpoint_path)
        if ck is not None:
            if ck.get("config_hash") != chash or ck.get("fingerprint") != fingerprint \
                    or ck.get("device_type") != dev.type:
                ck = None  # a checkpoint of another run: start fresh (it is overwritten)
        if ck is not None:
            logits = ck["logits"].to(dev)
            start_step = int(ck["step"])
            gen.set_state(ck["rng_state"].to("cpu") if dev.type == "cuda" else ck["rng_state"])
            hist = ck["history"]
            history = [dict(zip(HISTORY_KEYS, map(float, row))) for row in hist.tolist()]
            for h in history:
                h["step"] = int(h["step"])
            resumed_from = start_step

    def checkpoint(step: int) -> None:
        hist = torch.tensor([[h[kk] for kk in HISTORY_KEYS] for h in history], dtype=torch.float64)
        save_checkpoint(
            checkpoint_path,
            {
                "format": CHECKPOINT_FORMAT,
                "logits": logits.detach().cpu(),
                "step": step,
                "rng_state": gen.get_state(),
                "history": hist.reshape(-1, len(HISTORY_KEYS)),
                "config_hash": chash,
                "fingerprint": fingerprint,
                "device_type": dev.type,
            },
        )

    end_step = T if max_steps is None else min(T, max_steps)
    if cfg.lamb == 1.0:
        # f = f_qua is modular: quality top-k is its exact maximiser; sampling would only
        # approximate it. Logits = minus the quality rank (ties by id), exact in float32.
        pool_np = pool.cpu().numpy()
        qrank = ranks(order_by(q_np[pool_np], None if ids is None else np.asarray(ids)[pool_np]))
        logits[pool] = torch.as_tensor(-qrank.astype(np.float32), device=dev)
        start_step = end_step = T
        exact_topk = True
    else:
        exact_topk = False
    run_start = time.perf_counter()
    eval_time = 0.0
    prior_elapsed = history[-1]["elapsed_s"] if history else 0.0
    for step in range(start_step, end_step):
        lr = cfg.max_lr if T == 1 else cfg.max_lr + (cfg.min_lr - cfg.max_lr) * step / (T - 1)
        if m < P:
            B = pool[torch.randperm(P, generator=gen, device=dev)[:m]]
        else:
            B = pool
        batch = Batch(x.index_select(0, B).float(), q.index_select(0, B), mem_budget=mem_budget)
        idx = sample_masks(logits.index_select(0, B), G, kb, gen)
        f, fq, fd = score(batch, idx, term, cfg.lamb, cfg.term_norm, chunk=cfg.rollout_chunk)
        f = f.float()
        policy_step(logits, B, idx, f, lr)
        done = step + 1
        if done % every == 0 or done == end_step:
            elapsed = prior_elapsed + (time.perf_counter() - run_start - eval_time)
            rate = (done - start_step) / max(1e-9, elapsed - prior_elapsed)
            rec = {
                "step": done, "lr": float(lr), "mean_f": float(f.mean()), "best_f": float(f.max()),
                "mean_f_qua": float(fq.float().mean()), "mean_f_div": float(fd.float().mean()),
                "elapsed_s": float(elapsed),
            }
            history.append(rec)
            if progress is not None:
                progress(Progress(n_steps=T, eta_s=(T - done) / rate, **rec))
        if on_eval is not None and eval_every and (done % eval_every == 0 or done == end_step):
            t0 = time.perf_counter()
            el = prior_elapsed + (t0 - run_start - eval_time)
            sel, _ = readout(logits.cpu().numpy(), k, ids)
            on_eval(done, np.flatnonzero(sel), el)
            eval_time += time.perf_counter() - t0
        if checkpoint_path and checkpoint_every and done % checkpoint_every == 0 and done < end_step:
            checkpoint(done)
    steps_done = 0 if exact_topk else end_step
    if checkpoint_path and (checkpoint_every or max_steps is not None) and end_step > start_step:
        checkpoint(end_step)

    logits_np = logits.cpu().numpy().astype(np.float32)
    selected, rank = readout(logits_np, k, ids)
    return LearnResult(
        selected=selected, logits=logits_np, rank=rank, history=history, steps=steps_done,
        wall_time_s=time.perf_counter() - t_start, device=str(dev), resumed_from=resumed_from,
        config_hash=chash, sizes=sz,
    )
