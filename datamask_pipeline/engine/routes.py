"""The README's route tables: what ``solver: auto`` runs per term and n, and where the route
changes with n, rendered from :func:`engine.select.route_for` (the committed table, then its
overrides); tests/engine/test_solver_docs.py keeps the README equal to them."""

from __future__ import annotations

import re

DOC_SIZES = (5_000, 10_000, 20_000, 100_000, 1_000_000)
DOC_TERMS = ("DiSF", "Facility", "Pair_simi")


def switch_points(term: str, device_type: str = "cpu", lamb: float = 0.5,
                  hi: int = 10**7) -> list[tuple[int, str]]:
    """[(first n, route)]: where the route ``auto`` runs for ``term`` changes with n (n from
    100 to ``hi``), from :func:`engine.select.route_for` (the table, then its overrides)."""
    from .config import LearnerConfig
    from .select import route_for

    cfg = LearnerConfig.profile("pipeline", algorithm=term, lamb=lamb)

    def at(n):
        return route_for(cfg, n, device_type)[0]

    points, lo = [(100, at(100))], 100
    while lo < hi:
        # the next change after lo: doubling, then bisection
        step, cur = lo, points[-1][1]
        nxt = lo
        while nxt < hi and at(min(hi, nxt + step)) == cur:
            nxt, step = min(hi, nxt + step), step * 2
        if nxt >= hi:
            break
        a, b = nxt, min(hi, nxt + step)
        while b - a > 1:
            m = (a + b) // 2
            a, b = (m, b) if at(m) == cur else (a, m)
        points.append((b, at(b)))
        lo = b
    return points


def routes_markdown(device_type: str = "cpu", lamb: float = 0.5, sizes=DOC_SIZES,
                    terms=DOC_TERMS) -> str:
    """The README's table of what ``solver: auto`` runs per term and n on ``device_type`` (the
    pipeline profile), rendered from :func:`engine.select.route_for` and the committed table;
    tests/engine/test_solver_docs.py keeps the README equal to it."""
    from .config import LearnerConfig
    from .select import route_for

    lines = [f"| term | n | `auto` runs ({device_type}, λ = {lamb:g}) | why |", "|---|---|---|---|"]
    for term in terms:
        cfg = LearnerConfig.profile("pipeline", algorithm=term, lamb=lamb)
        for n in sizes:
            route, why = route_for(cfg, n, device_type)
            # "auto: S for T at n=N (the table's why)[; override]" -> "table: the table's why[; ...]"
            why = re.sub(r"^auto: \S+ for \S+ at n=\d+ \((.*?)\)(;|$)", r"table: \1\2", why or "")
            lines.append(f"| {term} | {n:,} | `{route}` | {why} |")

    def changes(term):
        pts = switch_points(term, device_type, lamb)
        if len(pts) == 1:
            return f"{term}: `{pts[0][1]}` at every n"
        return f"{term}: " + ", ".join(f"`{r}` from {n:,} rows" for n, r in pts)

    lines += ["", "Where the route changes with n (100 to 10⁷ rows): "
              + "; ".join(changes(t) for t in terms) + "."]
    return "\n".join(lines)
