"""Exact preparation of legal but awkward embeddings for the diversity terms: unit rows with the
norm taken in float64 (no eps floor), and DiSF's working frame (shifted by a reference row and
scaled by powers of two per dimension) so tiny, constant and huge dimensions are all exact.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

# Rows converted to float64 at a time when a budget is not given (bounds the float64 copy).
DEFAULT_CHUNK_BYTES = 64 << 20
# DiSF's per-dimension power-of-two exponents are clipped to this range so that the std floor
# and its square stay finite, normal float64 numbers (only float64 inputs beyond 2^±480 reach it).
MAX_EXPONENT = 480
# In float32, a DiSF std floor in [2^-60, 2^60] keeps every per-dimension statistic exact
# enough: a variance that underflows belongs to a std far below the floor, which wins anyway.
SAFE_FLOOR_F32 = (2.0**-60, 2.0**60)


def _row_chunks(n: int, d: int, budget: int | None):
    rows = max(1, int((budget or DEFAULT_CHUNK_BYTES) // max(1, 8 * 3 * d)))
    for s in range(0, n, rows):
        yield s, min(n, s + rows)


def pow2_exponent(a: torch.Tensor) -> torch.Tensor:
    """e with |a| = m·2^e, m in [0.5, 1) (frexp's exponent; 0 for a = 0)."""
    return torch.frexp(a).exponent


def _unit_rows_scaled(xs: torch.Tensor) -> torch.Tensor:
    """Unit rows in float64 via a power-of-two scale per row (exact for any finite row)."""
    xs = xs.to(torch.float64)
    # largest |entry| scaled into [0.5, 1): squares can neither overflow nor underflow
    xs = torch.ldexp(xs, -pow2_exponent(xs.abs().amax(dim=1))[:, None])
    norm = torch.linalg.vector_norm(xs, dim=1, keepdim=True)
    return xs / torch.where(norm > 0, norm, 1.0)


def unit_rows(x: torch.Tensor, budget: int | None = None) -> torch.Tensor:
    """x / ||x|| row by row, in x's dtype, with the norm computed in float64 and no eps floor,
    so neither tiny (1e-30) nor huge (1e30) rows lose their direction. Rows whose norm or its
    inverse leaves the safe range are scaled by a power of two first (exact). All-zero rows
    (which the data contract rejects) stay zero."""
    n, d = x.shape
    out = torch.empty_like(x)
    # multiply in float32 at least (bf16 / fp16 keep only the final rounding)
    cd = torch.float64 if x.dtype == torch.float64 else torch.float32
    fi = torch.finfo(cd)
    for s, e in _row_chunks(n, d, budget):
        xs = x[s:e]
        # float32 squares always fit float64; float64 ones only within +-1e150
        norm = torch.linalg.vector_norm(xs, dim=1, dtype=torch.float64)
        inv = 1.0 / norm
        ok = (inv >= fi.tiny) & (inv <= fi.max)
        if cd == torch.float64:
            ok &= (norm > 1e-150) & (norm < 1e150)
        out[s:e] = (xs.to(cd) * torch.where(ok, inv, 0.0).to(cd)[:, None]).to(x.dtype)
        # a float64 row's squares may all underflow: zero rows are found from the data then
        nonzero = (xs != 0).any(dim=1) if cd == torch.float64 else norm != 0
        bad = torch.nonzero(~ok & nonzero).flatten()
        if bad.numel():
            out[s + bad] = _unit_rows_scaled(xs[bad]).to(x.dtype)
    return out


class DisfFrame(NamedTuple):
    """DiSF's working copy of a ground set. ``x``: (x - x_ref) · 2^-e_a per dimension a, in the
    ground set's dtype (every dimension's largest |entry| in [0.5, 1), constant dimensions
    exactly 0); ``floor``: (d,) float64, the std floor in these units; ``stats_dtype``: the
    dtype per-dimension means / variances must be computed in to stay exact."""

    x: torch.Tensor
    floor: torch.Tensor
    stats_dtype: torch.dtype


def disf_frame(x: torch.Tensor, std_floor: float, budget: int | None = None) -> DisfFrame:
    """The frame in which DiSF is computed exactly (see :class:`DisfFrame`).

    DiSF standardises each dimension over the selection, so it is unchanged by a shift of the
    whole ground set and by a positive scale per dimension, provided the std floor is scaled
    with it. Shifting by a row of the ground set makes a constant dimension exactly 0 (no
    spurious correlation from a rounded mean); a power-of-two scale per dimension is exact and
    keeps huge (1e20) and tiny dimensions within range."""
    n, d = x.shape
    ref = x[0].to(torch.float64)
    chunks = list(_row_chunks(n, d, budget))
    shifted = (x.to(torch.float64) - ref) if len(chunks) == 1 else None  # one pass if it fits
    amax = torch.zeros(d, dtype=torch.float64, device=x.device)
    for s, e in chunks:
        part = shifted if shifted is not None else x[s:e].to(torch.float64) - ref
        amax = torch.maximum(amax, part.abs().amax(dim=0))
    ex = pow2_exponent(amax).clamp(-MAX_EXPONENT, MAX_EXPONENT)
    ex = torch.where(amax > 0, ex, torch.zeros_like(ex))
    one = torch.ones(d, dtype=torch.float64, device=x.device)
    scale = torch.ldexp(one, -ex)  # exact powers of two
    out = torch.empty_like(x)
    for s, e in chunks:
        part = shifted if shifted is not None else x[s:e].to(torch.float64) - ref
        out[s:e] = (part * scale).to(x.dtype)
    floor = float(std_floor) * scale
    if x.dtype == torch.float64:
        stats = torch.float64
    else:
        lo, hi = SAFE_FLOOR_F32
        safe = bool(((floor >= lo) & (floor <= hi)).all())
        stats = torch.float32 if safe else torch.float64
    return DisfFrame(out, floor, stats)
