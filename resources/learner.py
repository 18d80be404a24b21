"""The mask learner: runs the engine's ``learn()`` on a device, at a precision, with
checkpoints and progress reporting. torch is imported inside the methods, so loading the
definitions does not pay for it."""

from __future__ import annotations

import contextlib
import time
from typing import Callable, Optional

import dagster as dg
from pydantic import Field

from datamask_pipeline import settings
from datamask_pipeline.engine import storage

PRECISIONS = ("fp32", "tf32", "bf16")


class MaskLearner(dg.ConfigurableResource):
    """Owns the device (auto / cpu / cuda:N), the precision, the checkpoint location and
    cadence, and how progress is reported (run log while learning, shard report after)."""

    device: str = Field(
        default="auto",
        description="auto (CUDA when present, else CPU), cpu, or cuda:N. Env DATAMASK_DEVICE.",
    )
    precision: str = Field(
        default="fp32",
        description="fp32; tf32 (fp32 storage, TF32 matmuls on Ampere+ GPUs); bf16 (bfloat16 "
        "embeddings: half the memory). Env DATAMASK_PRECISION.",
    )
    checkpoint_every: int = Field(
        default=100,
        description="Save logits, RNG state and history every this many steps (0: never); a "
        "retried step resumes from the last checkpoint of the same config and data.",
    )
    checkpoint_dir: Optional[str] = Field(
        default=None,
        description="Where checkpoints are kept (path or URI). Default: <data root>/checkpoints.",
    )
    progress_every: int = Field(
        default=0,
        description="Record the objective curve every this many steps (0: n_epochs / 100).",
    )
    cpu_threads: int = Field(
        default=0,
        description="torch intra-op threads while the step computes on CPU (0: torch's "
        "default, all cores). Set 1 when several partitions run side by side on one machine. "
        "Env DATAMASK_CPU_THREADS.",
    )
    shard_report: bool = Field(
        default=True,
        description="After learning, write the shard report (HTML, PNG figures, metrics JSON) "
        "under <data root>/reports/<key>/ and link it in the metadata.",
    )
    log_interval_s: float = Field(
        default=10.0,
        description="Seconds between progress lines in the run log (first and last step are "
        "always logged).",
    )

    @classmethod
    def from_env(cls) -> "MaskLearner":
        """``DATAMASK_DEVICE`` / ``_PRECISION`` / ``_CPU_THREADS`` as ``dg.EnvVar`` fields when
        they are set now (read again when each run starts), the field defaults otherwise."""
        kw = {field: dg.EnvVar(name) for field, name in
              (("device", settings.ENV_DEVICE), ("precision", settings.ENV_PRECISION))
              if settings.is_set(name)}
        if settings.is_set(settings.ENV_CPU_THREADS):
            kw["cpu_threads"] = dg.EnvVar.int(settings.ENV_CPU_THREADS)
        return cls(**kw)

    # ------------------------------------------------------------------ pieces
    def torch_device(self):
        from datamask_pipeline.engine.device import resolve_device

        return resolve_device(self.device)

    def dtype(self):
        import torch

        p = self.precision.strip().lower()
        if p not in PRECISIONS:
            from datamask_pipeline.engine.config import ConfigError

            raise ConfigError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        return torch.bfloat16 if p == "bf16" else torch.float32

    def checkpoint_path(self, key: str, default: str) -> str:
        """``<checkpoint_dir>/<key>.pt`` when a directory is configured, else ``default``."""
        if not self.checkpoint_dir:
            return default
        key = storage.validate_partition_key(key)
        return storage.safe_child(self.checkpoint_dir, f"{key}.pt", allow_subdirs=False)

    @contextlib.contextmanager
    def session(self):
        """The compute settings of this resource for the enclosed torch work: TF32 matmuls
        (precision tf32 on CUDA) and the CPU thread count; restored afterwards."""
        import torch

        device = self.torch_device()
        tf32 = self.precision.strip().lower() == "tf32" and device.type == "cuda"
        old_tf32 = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
        old_threads = torch.get_num_threads()
        if tf32:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        if self.cpu_threads > 0 and device.type == "cpu":
            torch.set_num_threads(self.cpu_threads)
        try:
            yield device
        finally:
            torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old_tf32
            if torch.get_num_threads() != old_threads:
                torch.set_num_threads(old_threads)

    def estimate(self, n: int, d: int, cfg, resident_bytes: int = 0) -> dict:
        """The engine's pre-flight memory estimate for the route ``cfg`` takes on this device
        and precision (raises ConfigError when the run cannot fit). ``resident_bytes``: the
        shard's embeddings already in this process (they count as available on CPU)."""
        import torch

        from datamask_pipeline.engine.config import LEARNING_SOLVERS
        from datamask_pipeline.engine.learner import estimate_memory
        from datamask_pipeline.engine.select import route_for

        dtype = self.dtype()
        device = self.torch_device()
        route, _ = route_for(cfg, n, device)
        return estimate_memory(n, d, cfg, device, itemsize=torch.finfo(dtype).bits // 8,
                               learning=route in LEARNING_SOLVERS,
                               resident_bytes=resident_bytes if device.type == "cpu" else 0)

    def select(self, shard, cfg, *, checkpoint_path: str | None = None,
               log: Callable[[str], None] | None = None):
        """Run the engine's ``select_shard`` on this resource's device and precision and return
        its Selection. Progress lines go to ``log`` at most every ``log_interval_s`` seconds
        (plus the first and the last)."""
        from datamask_pipeline.engine.select import select_shard

        dtype = self.dtype()
        reporter = ProgressLog(log, self.log_interval_s) if log is not None else None
        with self.session() as device:
            return select_shard(
                shard, cfg, device=device, dtype=dtype, checkpoint_path=checkpoint_path,
                checkpoint_every=self.checkpoint_every if checkpoint_path else 0,
                progress=reporter, progress_every=self.progress_every or None,
            )


class ProgressLog:
    """Turns the engine's Progress records into log lines at a steady time cadence."""

    def __init__(self, log: Callable[[str], None], interval_s: float):
        self.log = log
        self.interval_s = max(0.0, float(interval_s))
        self._last = None

    def __call__(self, p) -> None:
        now = time.monotonic()
        first = self._last is None
        last = p.step >= p.n_steps
        if not (first or last or now - self._last >= self.interval_s):
            return
        self._last = now
        pct = 100.0 * p.step / max(1, p.n_steps)
        self.log(
            f"step {p.step}/{p.n_steps} ({pct:.0f}%) lr={p.lr:.3g} mean_f={p.mean_f:.6g} "
            f"best_f={p.best_f:.6g} f_qua={p.mean_f_qua:.5g} f_div={p.mean_f_div:.5g} "
            f"elapsed={p.elapsed_s:.1f}s eta={p.eta_s:.1f}s"
        )
