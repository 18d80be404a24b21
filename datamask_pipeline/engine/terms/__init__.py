"""The registry of diversity terms: one :class:`DiversityTerm` per term holds everything about
it (objective, greedy, polish moves, memory estimate, aliases). Built-ins: DiSF, Facility,
Pair_simi; plug-ins come from the entry-point group ``datamask.diversity_terms`` or
:func:`register`; :class:`Mixture` is a weighted sum of terms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

from .base import (CAPABILITIES, Batch, DiversityTerm, NotSupported, PolishContext, TermError,
                   default_mem_budget, rollout_chunks)
from .disf import DISF, DISF_STD_FLOOR
from .facility import FACILITY
from .pairwise import PAIRWISE
from .sampling import sample_size

__all__ = ["Batch", "BUILTIN_NAMES", "CAPABILITIES", "DISF_STD_FLOOR", "DiversityTerm",
           "ENTRY_POINT_GROUP", "Mixture", "NotSupported", "PolishContext", "TermError",
           "default_mem_budget", "get", "load_plugins", "names", "register", "rollout_chunks",
           "sample_size", "unregister"]

ENTRY_POINT_GROUP = "datamask.diversity_terms"

_TERMS: dict[str, DiversityTerm] = {}  # registered name -> term
_KEYS: dict[str, str] = {}  # lower-case name or alias -> registered name
_plugins = {"loaded": False, "error": None}


def _as_term(obj, where: str) -> DiversityTerm:
    term = obj() if isinstance(obj, type) and issubclass(obj, DiversityTerm) else obj
    if not isinstance(term, DiversityTerm):
        raise TermError(f"{where}: expected a DiversityTerm instance or subclass, got {obj!r}")
    if not isinstance(term.name, str) or not term.name.strip():
        raise TermError(f"{where}: a diversity term needs a non-empty name, got {term.name!r}")
    return term


def register(term, *, replace: bool = False) -> DiversityTerm:
    """Register a diversity term (an instance, or a subclass made with no arguments) under its
    ``name`` and ``aliases`` (case-insensitive). A name or alias already taken by another term
    is an error unless ``replace``. Returns the registered instance."""
    term = _as_term(term, "register()")
    keys = [term.name.lower()] + [str(a).lower() for a in term.aliases]
    for key in keys:
        owner = _KEYS.get(key)
        if owner is not None and owner != term.name and not replace:
            raise TermError(f"diversity term {term.name!r}: name or alias {key!r} is already "
                            f"taken by {owner!r}")
    if term.name in _TERMS:
        if not replace and _TERMS[term.name] is not term:
            raise TermError(f"diversity term {term.name!r} is already registered")
        unregister(term.name)
    _TERMS[term.name] = term
    for key in keys:
        _KEYS[key] = term.name
    return term


def unregister(name: str) -> None:
    """Remove a registered term (and its aliases); unknown names are ignored."""
    canon = _KEYS.get(str(name).lower(), name)
    if _TERMS.pop(canon, None) is not None:
        for key in [k for k, v in _KEYS.items() if v == canon]:
            del _KEYS[key]


def load_plugins(reload: bool = False) -> list[str]:
    """Register the terms of the entry-point group ``datamask.diversity_terms`` (each entry
    point loads a DiversityTerm instance or subclass). Runs once (again with ``reload``); a
    plug-in that fails to load raises TermError naming the entry point, now and on later
    look-ups that need the plug-ins. Returns the names registered by this call."""
    if _plugins["loaded"] and not reload:
        if _plugins["error"] is not None:
            raise _plugins["error"]
        return []
    from importlib.metadata import entry_points

    _plugins["loaded"], _plugins["error"] = True, None
    added = []
    for ep in sorted(entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        where = f"entry point {ep.name!r} ({ep.value}) of group {ENTRY_POINT_GROUP!r}"
        try:
            term = _as_term(ep.load(), where)
            if term.name in _TERMS and _TERMS[term.name] is not term and reload:
                unregister(term.name)
            register(term)
        except TermError as exc:
            err = exc if str(exc).startswith(where) else TermError(f"{where}: {exc}")
            _plugins["error"] = err
            raise err from exc
        except Exception as exc:  # the plug-in's own import or construction failed
            err = TermError(f"{where} failed to load: {type(exc).__name__}: {exc}")
            _plugins["error"] = err
            raise err from exc
        added.append(term.name)
    return added


def names() -> tuple[str, ...]:
    """Registered term names (built-ins first, then plug-ins by name)."""
    load_plugins()
    return BUILTIN_NAMES + tuple(sorted(n for n in _TERMS if n not in BUILTIN_NAMES))


def get(term) -> DiversityTerm:
    """The diversity term for ``term``: a name or alias (case-insensitive), a DiversityTerm
    (returned as is, registered or not; a subclass is instantiated) or a {name: weight} mapping (a :class:`Mixture`, or the
    term itself for a single weight of 1). Unknown names raise TermError (a ValueError)
    listing the registered names."""
    if isinstance(term, DiversityTerm):
        return term
    if isinstance(term, type) and issubclass(term, DiversityTerm):
        return term()
    if isinstance(term, Mapping):
        if len(term) == 1 and float(next(iter(term.values()))) == 1.0:
            return get(next(iter(term)))
        return Mixture(term)
    key = str(term).strip().lower()
    if key not in _KEYS:
        load_plugins()
    if key not in _KEYS:
        raise TermError(f"unknown diversity term {term!r}: choose one of {', '.join(names())}")
    return _TERMS[_KEYS[key]]


class Mixture(DiversityTerm):
    """f_div = sum_t w_t · f_t for ``{term: weight}`` (weights > 0, finite). Only the batched
    objective: greedy / polish / best_swap raise NotSupported."""

    def __init__(self, weights: Mapping):
        if not isinstance(weights, Mapping) or not weights:
            raise TermError("a mixture needs a non-empty {term: weight} mapping")
        parts: dict[str, tuple[DiversityTerm, float]] = {}
        for spec, w in weights.items():
            try:
                w = float(w)
            except (TypeError, ValueError):
                raise TermError(f"mixture: weight of {spec!r} must be a number, got {w!r}") from None
            if not (w > 0 and math.isfinite(w)):
                raise TermError(f"mixture: weight of {spec!r} must be > 0 and finite, got {w}")
            term = get(spec)
            if isinstance(term, Mixture):
                raise TermError(f"mixture: {spec!r} is itself a mixture")
            prev = parts.get(term.name)
            parts[term.name] = (term, w + (prev[1] if prev else 0.0))
        self.parts = parts
        self.name = " + ".join(f"{w:g}·{n}" for n, (_, w) in parts.items())
        self.aliases = ()
        self.min_k = max(t.min_k for t, _ in parts.values())

    @property
    def weights(self) -> dict[str, float]:
        return {n: w for n, (_, w) in self.parts.items()}

    def batched(self, batch: Batch, idx: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
        out = None
        for term, w in self.parts.values():
            v = w * term.batched(batch, idx, chunk)
            out = v if out is None else out + v
        return out

    def workspace_bytes(self, m, k, d, itemsize, budget) -> int:
        """The budget once (parts run one after another) plus what each part keeps cached."""
        extra = sum(t.workspace_bytes(m, k, d, itemsize, budget) - int(budget)
                    for t, _ in self.parts.values())
        return int(budget) + int(extra)

    def __repr__(self) -> str:
        return f"<diversity mixture {self.name}>"


for _t in (DISF, FACILITY, PAIRWISE):
    register(_t)
BUILTIN_NAMES: tuple[str, ...] = tuple(sorted(_TERMS))
