"""The policy-gradient update rule (docs/method.md#learner), reproduced by hand."""

import numpy as np
import pytest
import torch

from datamask_pipeline.engine.learner import advantages, policy_step


def _case(seed=0, n=12, m=8, G=5, kb=3):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, generator=g)
    B = torch.randperm(n, generator=g)[:m]
    idx = torch.stack([torch.randperm(m, generator=g)[:kb] for _ in range(G)])
    f = torch.randn(G, generator=g)
    return logits, B, idx, f


def test_one_step_by_hand():
    logits, B, idx, f = _case()
    before = logits.clone()
    lr = 2.5
    assert policy_step(logits, B, idx, f, lr)
    # by hand: A_g = (f_g - mean) / (std + 1e-8); every logit of the batch moves by lr/G times
    # the sum of the advantages of the rollouts whose mask contains it
    fn = f.double().numpy()
    A = (fn - fn.mean()) / (fn.std() + 1e-8)
    G = len(fn)
    expect = before.double().numpy().copy()
    for g in range(G):
        for pos in idx[g].tolist():
            expect[int(B[pos])] += lr / G * A[g]
    np.testing.assert_allclose(logits.double().numpy(), expect, rtol=0, atol=1e-5)


def test_advantages_are_group_normalised():
    f = torch.tensor([1.0, 2.0, 3.0, 6.0])
    a = advantages(f)
    assert abs(float(a.mean())) < 1e-6
    assert abs(float(a.std(unbiased=False)) - 1.0) < 1e-6
    # invariant to a shift and a positive scale of f
    np.testing.assert_allclose(advantages(3 * f + 7).numpy(), a.numpy(), atol=1e-6)


def test_tied_rollouts_skip_the_update():
    logits, B, idx, _ = _case(1)
    before = logits.clone()
    assert advantages(torch.full((5,), 0.25)) is None
    assert not policy_step(logits, B, idx, torch.full((5,), 0.25), 10.0)
    assert torch.equal(logits, before)


def test_only_the_batch_logits_move():
    logits, B, idx, f = _case(2, n=40, m=10)
    before = logits.clone()
    policy_step(logits, B, idx, f, 5.0)
    outside = torch.ones(40, dtype=torch.bool)
    outside[B] = False
    assert torch.equal(logits[outside], before[outside])
    # and inside the batch, exactly the positions some mask used moved
    used = torch.zeros(40, dtype=torch.bool)
    used[B[idx.reshape(-1)]] = True
    assert (logits[used] != before[used]).all()
    assert torch.equal(logits[outside | ~used], before[outside | ~used])


def test_the_update_sums_to_zero():
    """Advantages sum to zero, so the step moves probability mass without a net drift."""
    logits, B, idx, f = _case(3)
    before = logits.clone()
    policy_step(logits, B, idx, f, 1.0)
    assert abs(float((logits - before).sum())) < 1e-5


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_update_equals_cpu_and_is_deterministic():
    logits, B, idx, f = _case(4, n=5000, m=2000, G=128, kb=200)
    cpu = logits.clone()
    policy_step(cpu, B, idx, f, 3.0)
    outs = []
    for _ in range(3):
        lg = logits.cuda()
        policy_step(lg, B.cuda(), idx.cuda(), f.cuda(), 3.0)
        outs.append(lg.cpu())
    assert all(torch.equal(outs[0], o) for o in outs[1:])  # bit-identical across calls
    torch.testing.assert_close(outs[0], cpu, rtol=0, atol=1e-5)
