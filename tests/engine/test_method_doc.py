"""docs/method.md's precision row says what the learner does with ``bf16``: the embeddings
are stored in bfloat16 and every batch is scored in float32 (the learner is spied on)."""

from pathlib import Path

import numpy as np
import torch

from datamask_pipeline.engine import learner as learner_mod
from datamask_pipeline.engine.config import LearnerConfig

METHOD = (Path(__file__).resolve().parents[2] / "docs" / "method.md").read_text()


def _precision_row() -> str:
    rows = [line for line in METHOD.splitlines() if line.startswith("| Precision |")]
    assert len(rows) == 1
    return rows[0]


def test_bf16_learner_scores_float32_batches(monkeypatch):
    seen = []
    real = learner_mod.Batch

    def spy(x, q, *a, **kw):
        seen.append((x.dtype, q.dtype))
        return real(x, q, *a, **kw)

    monkeypatch.setattr(learner_mod, "Batch", spy)
    rng = np.random.default_rng(0)
    x = torch.as_tensor(rng.normal(size=(200, 8)), dtype=torch.float32)
    q = torch.as_tensor(rng.random(200), dtype=torch.float32)
    cfg = LearnerConfig(algorithm="DiSF", n_epochs=3, n_rollout=4, partial=0.5, select_ratio=0.1)
    learner_mod.learn(x, q, cfg, device="cpu", dtype=torch.bfloat16)
    assert seen and set(seen) == {(torch.float32, torch.float32)}


def test_method_doc_precision_row_matches_the_learner():
    row = _precision_row()
    bf16 = row[row.index("`bf16`"):]
    assert "term arithmetic in bfloat16" not in bf16
    assert "stores the embeddings in bfloat16" in bf16
    assert "casts each batch to float32" in bf16
