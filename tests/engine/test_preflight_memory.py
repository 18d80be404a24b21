"""The pre-flight's notion of available memory: MemAvailable on Linux (page cache counts), and
the shard the caller already holds counted once, not twice."""

import os

import pytest
import torch

from datamask_pipeline.engine import learner
from datamask_pipeline.engine.config import ConfigError, LearnerConfig
from datamask_pipeline.engine.device import device_memory


def _meminfo(field):
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


@pytest.mark.skipif(not os.path.exists("/proc/meminfo"), reason="Linux only")
def test_cpu_memory_is_mem_available_not_mem_free():
    got = device_memory(torch.device("cpu"))
    avail = _meminfo("MemAvailable")
    assert abs(got - avail) < 512 << 20  # read moments apart
    assert got >= _meminfo("MemFree") - (512 << 20)


def test_resident_embeddings_count_as_available(monkeypatch):
    n, d = 1_000_000, 768
    held = n * d * 4  # the loaded embeddings: 2.86 GiB
    cfg = LearnerConfig(algorithm="Pair_simi", solver="topk+polish")
    monkeypatch.setattr(learner, "device_memory", lambda device: 1 << 50)
    total = learner.estimate_memory(n, d, cfg, "cpu", learning=False,
                                    mem_budget=1 << 30)["total_bytes"]
    assert total > held  # the estimate counts the embeddings among its parts
    free = total - held // 2  # fits only if the held shard is not counted twice
    monkeypatch.setattr(learner, "device_memory", lambda device: free)
    with pytest.raises(ConfigError, match="exceeds the"):
        learner.estimate_memory(n, d, cfg, "cpu", learning=False, mem_budget=1 << 30)
    est = learner.estimate_memory(n, d, cfg, "cpu", learning=False, mem_budget=1 << 30,
                                  resident_bytes=held)
    assert est["available_bytes"] == free + held
    assert est["total_bytes"] == total
