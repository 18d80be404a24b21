"""Which torch device a run uses and how much memory it can still give (CUDA or CPU)."""

from __future__ import annotations

import os

import torch


class DeviceError(ValueError):
    """The requested device does not exist on this machine."""


def resolve_device(spec: str | torch.device | None = "auto") -> torch.device:
    """``auto`` -> CUDA when present, else CPU; ``cuda:N`` must exist; ``cpu`` always works."""
    if isinstance(spec, torch.device):
        spec = str(spec)
    spec = (spec or "auto").strip().lower()
    if spec == "auto":
        return torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    if spec == "cpu":
        return torch.device("cpu")
    if spec.startswith("cuda"):
        if not torch.cuda.is_available():
            raise DeviceError(
                f"device {spec!r} requested but CUDA is not available on this machine "
                f"(torch {torch.__version__}, built with CUDA {torch.version.cuda}); "
                "use --device cpu or --device auto"
            )
        dev = torch.device(spec if ":" in spec else "cuda:0")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DeviceError(
                f"device {spec!r} requested but only {torch.cuda.device_count()} CUDA "
                "device(s) are visible"
            )
        return dev
    raise DeviceError(f"unknown device {spec!r}: use auto, cpu or cuda:N")


def device_memory(device: torch.device) -> int:
    """Bytes the device can still give us."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    # Linux: MemAvailable (free memory plus the page cache the kernel can drop). MemFree
    # alone reads as a few GiB on a machine that just wrote a large shard.
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError):  # pragma: no cover - non-POSIX
        return 1 << 40
