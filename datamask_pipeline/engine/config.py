"""Every method knob, declared once: types, ranges, choices, descriptions and the two named
profiles. The CLI flags, the Dagster config (``assets/learn.py``) and the README's knob table
are derived from :class:`LearnerConfig`; nothing else declares a knob or copies a default.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from typing import Dict, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

TERM_NORMS = ("none", "standardize")
INITS = ("same", "quality")
# The solvers (docs/method.md#solvers, README "Solvers"): "paper" is the published method
# with upstream's behaviour; the others are ours and are judged on the whole-shard objective.
SOLVERS = ("paper", "paper+polish", "topk+polish", "sgreedy+polish", "greedy", "auto")
# Solvers that run the policy-gradient learner (the others need no learning steps).
LEARNING_SOLVERS = ("paper", "paper+polish")


class ConfigError(ValueError):
    """A configuration that cannot work; raised before any work is done."""


def canonical_algorithm(name: str) -> str:
    """The registered name of a diversity term (case-insensitive, aliases accepted)."""
    from . import terms

    try:
        return terms.get(name).name
    except (KeyError, ValueError):
        import difflib

        known = list(terms.names())
        close = difflib.get_close_matches(str(name).lower(), [n.lower() for n in known], n=1,
                                          cutoff=0.6)
        hint = f"; did you mean {known[[n.lower() for n in known].index(close[0])]!r}?" if close else ""
        raise ConfigError(
            f"unknown algorithm {name!r}: choose one of {', '.join(known)}{hint}"
        ) from None


def n_select(select_ratio: float, n: int) -> int:
    """k = round(select_ratio * n), at least 1."""
    return max(1, int(round(select_ratio * n)))


def _knob(default, description: str, *, flags=(), **constraints):
    """A knob: its default (the ``upstream`` profile), what it means, and its CLI spellings."""
    return Field(default, description=description, json_schema_extra={"flags": list(flags)},
                 **constraints)


class LearnerConfig(BaseModel):
    """The method's knobs. Field defaults are the ``upstream`` profile: upstream's
    ``train_mask.py`` defaults (the paper's GPU settings) except ``select_ratio`` (0.1, the ~10%
    of FineWeb-Mask). :data:`PROFILES` holds the pipeline's profile."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    algorithm: str = _knob(
        "DiSF",
        "Diversity term f_div: DiSF (decorrelated embedding dimensions), Facility (facility "
        "location: coverage), Pair_simi (minus mean pair-wise cosine), or a plug-in term's name. "
        "Shorthand for terms = {algorithm: 1}.",
        flags=("--algorithm",))
    terms: Optional[Dict[str, float]] = _knob(
        None,
        "Several diversity terms as {name: weight} (weights > 0): f_div = Σ weight · term. "
        "Overrides algorithm when set.",
        flags=("--terms",))
    lamb: float = _knob(
        0.5, "λ in f = λ·f_qua + (1−λ)·f_div, in [0, 1]; 1 = quality only (the exact quality "
        "top-k). The paper uses 0.5 and recommends 0.1–0.5.", flags=("--lamb",), ge=0.0, le=1.0)
    select_ratio: float = _knob(
        0.1, "Fraction of the shard to keep, in (0, 1): k = round(select_ratio · n).",
        flags=("--select_ratio",), gt=0.0, lt=1.0)
    n_epochs: int = _knob(
        5000, "Policy-gradient update steps (5,000 in the upstream README).",
        flags=("--n_epochs",), ge=1)
    n_rollout: int = _knob(
        128, "Masks G sampled per step (group for the normalised advantage); 128–256 "
        "recommended, too few diverges.", flags=("--n_rollout",), ge=2)
    partial: float = _knob(
        0.1, "Fraction of the (pruned) shard drawn as each step's batch, in (0, 1]; diversity "
        "is computed within the batch. 0.05–0.1 recommended.", flags=("--partial",),
        gt=0.0, le=1.0)
    max_lr: float = _knob(10.0, "Learning rate at the first step (falls linearly to min_lr).",
                          flags=("--max_lr",), gt=0.0)
    min_lr: float = _knob(1.0, "Learning rate at the last step.", flags=("--min_lr",), ge=0.0)
    init: Literal["quality", "same"] = _knob(
        "quality", "Initial logits: 'quality' (p_i ∝ normalised quality; the learner starts at "
        "quality top-k) or 'same' (uniform).", flags=("--init",))
    prune_ratio: float = _knob(
        0.0, "Drop this bottom fraction by quality before selecting, in [0, 1) (the paper "
        "prunes 40–50%; 0 = off). Masks then pick k/pool of each batch, the read-out's ratio.",
        flags=("--prune_ratio", "--prune-ratio"), ge=0.0, lt=1.0)
    term_norm: Literal["none", "standardize"] = _knob(
        "none", "'none' (paper) or 'standardize' (z-score f_qua and f_div across the rollouts "
        "before mixing; re-weights λ towards diversity).", flags=("--term_norm", "--term-norm"))
    seed: int = _knob(0, "Random seed (batches, Gumbel noise, stochastic greedy, the random "
                         "baseline).", flags=("--seed",))
    solver: Literal["paper", "paper+polish", "topk+polish", "sgreedy+polish", "greedy", "auto"] = _knob(
        "paper",
        "paper: the policy-gradient learner alone (upstream); paper+polish: then a swap local "
        "search on the whole-shard objective; topk+polish: the swap search from quality top-k; "
        "sgreedy+polish: from a stochastic greedy; greedy: exact greedy; auto: the measured "
        "fastest route to the best whole-shard f for the term, n and device.",
        flags=("--solver",))
    polish_time_budget_s: Optional[float] = _knob(
        None, "Wall-clock cap in seconds on the swap search of the +polish solvers; unset = "
        "a default that grows with the shard, max(120 s, 0.6 ms × n): 120 s up to 200,000 rows, "
        "600 s at 10^6 (a search that ends sooner is not affected). When it binds, the result "
        "is the best swap set found so far (the run's polish record says so and which budget "
        "applied).",
        flags=("--polish_time_budget_s", "--polish-time-budget-s"), gt=0.0)
    rollout_chunk: Optional[int] = _knob(
        None, "Rollouts scored at once (memory vs speed); unset = chosen from the objective's "
        "memory budget. Does not change the result.", flags=("--rollout_chunk",), ge=1)
    facility_similarity: Literal["auto", "dense", "sparse"] = _knob(
        "auto",
        "Facility location's whole-shard similarity (greedy, polish, evaluation): dense (exact, "
        "n×n held in memory), sparse (each row's facility_neighbors nearest neighbours; a row "
        "with none selected counts 0) or auto (dense when n×n fits half the objective memory "
        "budget, else sparse). The learner's batches always use dense.",
        flags=("--facility_similarity", "--facility-similarity"))
    facility_neighbors: int = _knob(
        64, "Neighbours per row K of the sparse facility similarity (itself included); more is "
        "closer to dense and costs n·K memory.",
        flags=("--facility_neighbors", "--facility-neighbors"), ge=2, le=4096)
    facility_knn: Literal["auto", "faiss", "exact"] = _knob(
        "auto", "How the sparse similarity's neighbours are found: faiss (IVF index, "
        "approximate), exact (blockwise top-k) or auto (faiss on CPU when installed, else "
        "exact).", flags=("--facility_knn", "--facility-knn"))

    # ------------------------------------------------------------ construction
    def __init__(self, **data):
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise ConfigError(_describe(exc)) from None

    @model_validator(mode="after")
    def _canonical_terms(self):
        object.__setattr__(self, "algorithm", canonical_algorithm(self.algorithm))
        if self.terms is not None:
            if not self.terms:
                raise ValueError("terms must name at least one diversity term")
            canon: dict = {}
            for name, w in self.terms.items():
                if not (w > 0):
                    raise ValueError(f"terms: weight of {name!r} must be > 0, got {w}")
                c = canonical_algorithm(name)
                canon[c] = canon.get(c, 0.0) + float(w)
            object.__setattr__(self, "terms", dict(sorted(canon.items())))
        return self

    # ------------------------------------------------------------ the objective
    @property
    def term_spec(self) -> dict:
        """The diversity part as {canonical name: weight}."""
        return dict(self.terms) if self.terms else {self.algorithm: 1.0}

    @property
    def term_label(self) -> str:
        """A readable name of the diversity part: ``DiSF`` or ``0.5·DiSF + 1·Pair_simi``."""
        spec = self.term_spec
        if len(spec) == 1 and next(iter(spec.values())) == 1.0:
            return next(iter(spec))
        return " + ".join(f"{w:g}·{n}" for n, w in spec.items())

    def diversity_term(self, whole_shard: bool = True):
        """The configured diversity term (a Mixture for several). ``whole_shard``: facility
        location on the similarity the facility_* knobs choose (greedy, polish, evaluation);
        False: the registered terms (the learner's batch-local objective)."""
        from . import terms
        from .terms.facility import FacilityLocation

        spec = self.term_spec
        if whole_shard and "Facility" in spec:
            fac = FacilityLocation(self.facility_similarity, self.facility_neighbors,
                                   self.facility_knn)
            spec = {(fac if name == "Facility" else name): w for name, w in spec.items()}
        if len(spec) == 1 and next(iter(spec.values())) == 1.0:
            return terms.get(next(iter(spec)))
        return terms.Mixture(spec)

    # ------------------------------------------------------------------ checks
    def validate(self, n: int | None = None) -> None:
        """Field ranges are checked at construction; this checks the knobs against a shard of
        n rows (raises ConfigError naming the knob and the rule)."""
        if n is not None:
            self.sizes(n)

    def sizes(self, n: int, learning: bool | None = None) -> dict:
        """Derived sizes for a shard of n rows: k, pool (after pruning), batch m, k' per mask.

        Without pruning k' = round(select_ratio · m) (upstream). With pruning the read-out
        keeps k of the pool's P rows, so masks keep the same fraction: k' = round(k · m / P).
        The batch sizes are checked when the learner runs (``learning``; default: when the
        solver is one of the learner's)."""
        if n < 2:
            raise ConfigError(f"a shard needs at least 2 rows to select from, got {n}")
        k = n_select(self.select_ratio, n)
        if k >= n:
            raise ConfigError(
                f"select_ratio={self.select_ratio} selects k={k} of n={n} rows: nothing to choose"
            )
        pool = n - int(self.prune_ratio * n)
        if pool < k:
            raise ConfigError(
                f"prune_ratio={self.prune_ratio} leaves {pool} rows, fewer than k={k}: lower prune_ratio"
            )
        m = min(pool, max(1, int(round(self.partial * pool))))
        ratio = self.select_ratio if pool == n else k / pool
        k_batch = max(1, int(round(ratio * m)))
        if learning is None:
            learning = self.solver in LEARNING_SOLVERS
        if learning:
            min_k = max(self.diversity_term().min_k, 1)  # a Mixture's is its parts' largest
            if k_batch < min_k:
                raise ConfigError(
                    f"partial={self.partial} gives batches of {m} rows and masks of k'={k_batch} "
                    f"samples; {self.term_label} needs k' >= {min_k}: raise partial or select_ratio"
                )
            if k_batch >= m:
                raise ConfigError(
                    f"partial={self.partial} gives batches of {m} rows, too small for one mask of "
                    f"k'={k_batch} with anything left to choose: raise partial"
                )
        return {"n": n, "k": k, "pool": pool, "batch": m, "k_batch": k_batch}

    # ------------------------------------------------------------- identity
    def to_dict(self) -> dict:
        return self.model_dump()

    def config_hash(self) -> str:
        """Stable hash of everything that changes the result (rollout_chunk does not; terms
        and polish_time_budget_s left unset hash as before they existed)."""
        d = self.to_dict()
        d.pop("rollout_chunk", None)
        if d.get("terms") is None:
            d.pop("terms", None)
        if d.get("polish_time_budget_s") is None:  # unset: hash as before the knob existed
            d.pop("polish_time_budget_s", None)
        for f in ("facility_similarity", "facility_neighbors", "facility_knn"):
            if d[f] == type(self).model_fields[f].default:  # at defaults: hash as before them
                d.pop(f)
        blob = json.dumps(d, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def replace(self, **changes) -> "LearnerConfig":
        return type(self)(**{**self.to_dict(), **changes})

    @classmethod
    def profile(cls, name: str = "upstream", **overrides) -> "LearnerConfig":
        """A named profile (``upstream``, ``pipeline``; old names warn) with overrides."""
        return cls(**{**profile_defaults(name), **overrides})


# The named profiles. "upstream": the field defaults above, exact upstream behaviour, the
# train_mask CLI's default. "pipeline": the Dagster pipeline's default, the best solver the bench
# measured (README "Solvers", bench/results/REPORT.md).
PROFILES: Dict[str, dict] = {
    "upstream": {},
    "pipeline": {"solver": "auto"},
}
# A preset of learner knobs that finishes a 5k-row demo shard on 2 CPU cores in about a
# minute when the learner runs (solver paper or paper+polish).
CPU_DEMO_PRESET = dict(n_epochs=400, n_rollout=64, partial=0.1)
# Old names that keep working with a DeprecationWarning (CHANGELOG.md).
DEPRECATED_PROFILES = {"paper": "upstream"}


def profile_defaults(name: str) -> dict:
    """Every knob's value in profile ``name`` (a full dict, field defaults included)."""
    key = str(name).strip().lower()
    if key in DEPRECATED_PROFILES:
        new = DEPRECATED_PROFILES[key]
        warnings.warn(f"profile {name!r} is deprecated: use {new!r}", DeprecationWarning,
                      stacklevel=3)
        key = new
    if key not in PROFILES:
        raise ConfigError(f"unknown profile {name!r}: choose one of {tuple(PROFILES)}")
    defaults = {f: info.default for f, info in LearnerConfig.model_fields.items()}
    return {**defaults, **PROFILES[key]}


def knob_flags(field: str) -> list:
    """The command-line spellings of a knob (the first is upstream's)."""
    extra = LearnerConfig.model_fields[field].json_schema_extra or {}
    return list(extra.get("flags") or [f"--{field}"])


def knobs_markdown(profile: str = "pipeline") -> str:
    """The README's knob table, rendered from :class:`LearnerConfig` (a test keeps them equal)."""
    up = profile_defaults("upstream")
    other = profile_defaults(profile)
    lines = [f"| knob | `upstream` (train_mask) | `{profile}` (Dagster) | meaning |",
             "|---|---|---|---|"]
    for f, info in LearnerConfig.model_fields.items():
        desc = (info.description or "").replace("|", "\\|")
        lines.append(f"| `{f}` | {_fmt(up[f])} | {_fmt(other[f])} | {desc} |")
    return "\n".join(lines)


def _fmt(v) -> str:
    if v is None:
        return "unset"
    return f"`{v}`"


_LABELS = {"lamb": "lamb (lambda)"}


def _interval(meta) -> str | None:
    lo = hi = None
    for m in meta:
        for attr, side in (("gt", "("), ("ge", "[")):
            if getattr(m, attr, None) is not None:
                lo = (side, getattr(m, attr))
        for attr, side in (("lt", ")"), ("le", "]")):
            if getattr(m, attr, None) is not None:
                hi = (side, getattr(m, attr))
    if lo and hi:
        return f"in {lo[0]}{lo[1]:g}, {hi[1]:g}{hi[0]}"
    if lo:
        return f"{'>' if lo[0] == '(' else '>='} {lo[1]:g}"
    if hi:
        return f"{'<' if hi[0] == ')' else '<='} {hi[1]:g}"
    return None


def describe_validation_error(exc: ValidationError) -> str:
    """A pydantic ValidationError over these knobs (LearnerConfig's, or a model with the same
    field names such as the pipeline's MaskConfig) as one readable line naming each knob."""
    return _describe(exc)


def knob_constraints(field: str) -> dict:
    """The range of a knob as pydantic ``Field`` keyword arguments (gt, ge, lt, le)."""
    out = {}
    for m in LearnerConfig.model_fields[field].metadata:
        for attr in ("gt", "ge", "lt", "le"):
            if getattr(m, attr, None) is not None:
                out[attr] = getattr(m, attr)
    return out


def _describe(exc: ValidationError) -> str:
    """One line per broken knob, naming the knob, its rule and the value given."""
    from typing import get_args

    parts = []
    for err in exc.errors():
        loc = err.get("loc", ())
        field = str(loc[0]) if loc else ""
        info = LearnerConfig.model_fields.get(field)
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        if info is None:
            parts.append(f"{field}: {msg}" if field else msg)
            continue
        label = _LABELS.get(field, field)
        rule = _interval(info.metadata)
        choices = get_args(info.annotation) if "Literal" in str(info.annotation) else ()
        if err.get("type") == "value_error":
            parts.append(msg)
        elif choices:
            parts.append(f"{label} must be one of {choices}, got {err.get('input')!r}")
        elif rule and err.get("type", "").startswith(("greater", "less")):
            parts.append(f"{label} must be {rule}, got {err.get('input')!r}")
        else:
            parts.append(f"{label}: {msg} (got {err.get('input')!r})")
    return "; ".join(parts)
