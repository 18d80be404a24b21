"""The markdown report of one benchmark run (written next to its JSON)."""

from __future__ import annotations


def _f(v, spec=".4f", none="—"):
    if v is None:
        return none
    try:
        return format(v, spec)
    except (TypeError, ValueError):
        return str(v)


def _pct(v, digits=2):
    return "—" if v is None else f"{100 * v:.{digits}f}%"


def _s(v):
    if v is None:
        return "—"
    return f"{v:.3g}s" if v < 100 else f"{v:.0f}s"


def _cells(res, term):
    return sorted([c for c in res.get("time_to_greedy", {}).get("cells", []) if c["term"] == term],
                  key=lambda c: c["n"])


def _target_cell(res, term, n_target):
    """The cell at n_target with a measured greedy f, else the largest n with one."""
    cells = [c for c in _cells(res, term) if c["greedy"].get("f") is not None]
    exact = [c for c in cells if c["n"] == n_target]
    if exact:
        return exact[0], True
    return (cells[-1], False) if cells else (None, False)


def targets(res) -> list:
    """Every headline ratio of issue 4 against its target: (target, measured, met, limit)."""
    rows = []
    N = 100_000
    # 1. DiSF: 99.5% of greedy's f within 10% of greedy's time
    c, exact = _target_cell(res, "DiSF", N)
    big = [x for x in _cells(res, "DiSF") if x["n"] == N]
    if c:
        where = f"n={c['n']}" + ("" if exact else " (largest n with greedy's f measured)")
        for name in ("paper", "paper+polish"):
            r = c[name]["time_to_over_greedy"].get("0.995")
            rows.append({"target": f"DiSF: 99.5% of f_greedy in <= 10% of greedy's time [{name}]",
                         "where": where,
                         "measured": ("never reached" if r is None else f"{100 * r:.1f}% of greedy's time")
                         + f"; best {_pct(c[name].get('best_fraction') or c[name].get('fraction'), 3)} of f_greedy",
                         "met": r is not None and r <= 0.10})
    if big:
        b = big[0]
        rows.append({"target": "DiSF at n=1e5: paper+polish total time vs greedy's (greedy time "
                               + ("extrapolated" if b["greedy"].get("extrapolated") else "measured") + ")",
                     "where": f"n={N}",
                     "measured": _pct(b["paper+polish"].get("time_over_greedy"), 1) + " of greedy's time",
                     "met": None})
    # 2. pair-wise and facility: 100% of greedy's f within greedy's time
    for term in ("Pair_simi", "Facility"):
        c, exact = _target_cell(res, term, N)
        if not c:
            continue
        where = f"n={c['n']}" + ("" if exact else " (largest n with greedy's f measured)")
        for name in ("paper", "paper+polish"):
            r = c[name]["time_to_over_greedy"].get("1")
            rows.append({"target": f"{term}: 100% of f_greedy in <= greedy's time [{name}]",
                         "where": where,
                         "measured": ("never reached" if r is None else f"{r:.2f}x greedy's time")
                         + f"; best {_pct(c[name].get('best_fraction') or c[name].get('fraction'), 3)} of f_greedy",
                         "met": r is not None and r <= 1.0})
    # 3. beat greedy's objective
    for term in ("DiSF", "Facility", "Pair_simi"):
        c, exact = _target_cell(res, term, N)
        if not c:
            continue
        where = f"n={c['n']}" + ("" if exact else " (largest n with greedy's f measured)")
        fr = c["paper+polish"]["fraction"]
        tr = c["paper+polish"].get("time_over_greedy")
        rows.append({"target": f"{term}: paper+polish >= 100% of f_greedy"
                               + (" at lower total time than greedy" if term == "DiSF" else ""),
                     "where": where,
                     "measured": f"{_pct(fr, 3)} of f_greedy in {_pct(tr, 1)} of greedy's time",
                     "met": fr is not None and fr >= 1.0 - 1e-12 and (term != "DiSF" or (tr or 9) < 1)})
    # 4. hardware
    hw = res.get("hardware", {})
    for k in hw.get("kernels", []):
        if k.get("bound") == "compute":
            rows.append({"target": f"compute-bound kernel >= 50% of matmul: {k['kernel']}",
                         "where": hw.get("device", ""), "measured": _pct(k["fraction_of_matmul"], 0),
                         "met": k["fraction_of_matmul"] >= 0.5})
    # 5. pipeline
    p = res.get("pipeline", {})
    if p.get("added_fraction_shard") is not None:
        rows.append({"target": "Dagster adds <= 10% over the engine alone (one shard)",
                     "where": f"{p['rows']} rows x {p['dim']}-d, preset {p.get('preset', 'cpu-demo')}, "
                              f"learning {_s(p.get('engine_learn_s'))}",
                     "measured": f"{_pct(p['added_fraction_shard'], 1)} (shard materialization vs engine CLI process); "
                                 f"{_pct(p.get('added_fraction_process'), 1)} whole demo process",
                     "met": p["added_fraction_shard"] <= 0.10})
    return rows


def render(res: dict) -> str:
    L = []
    a = L.append
    mach = res["machine"]
    a(f"# DATAMASK benchmark — {res['mode']} mode\n")
    a(f"Produced by:\n\n```\n{res['command']}\n```\n")
    a(f"Started {res['started']}, took {_s(res.get('total_s'))} of wall time.\n")
    a("## Machine\n")
    a("| | |\n|---|---|")
    for k in ("cpu_model", "cpu_count", "memory_gib", "device", "cuda_device", "torch", "torch_threads",
              "numpy", "pyarrow", "dagster", "python", "platform", "loadavg_start", "loadavg_end"):
        if k in mach:
            a(f"| {k} | {mach[k]} |")
    a("\nThe machine is shared with other work: every comparison below is measured in this one "
      "process, interleaved where it matters, and reported as medians; process CPU time is kept in "
      "the JSON next to wall time.\n")
    a(f"Data: {res['data']}. λ = {res['settings']['lamb']}, k = {res['settings']['select_ratio']:.0%} "
      f"of n. Learner: G = {res['settings']['rollouts']}, {res['settings']['steps']} steps, "
      f"lr 10 → 1, init quality, term_norm none, partial = min({res['settings']['partial']}, "
      f"{res['settings']['max_batch']}/n) (at least 30 samples per mask).\n")

    tg = res.get("time_to_greedy")
    if tg:
        a("## Headline targets (issue 4)\n")
        a("| target | where | measured | met |\n|---|---|---|---|")
        for r in targets(res):
            met = {True: "yes", False: "**no**", None: "not measurable (f_greedy unknown)"}[r["met"]]
            a(f"| {r['target']} | {r['where']} | {r['measured']} | {met} |")
        a("")
        a("## Time to greedy's objective, per term and n\n")
        a("f is the whole-shard objective. *frac* = f / f_greedy; *gap* = (f − f_topk)/(f_greedy − "
          "f_topk) (the learner starts at quality top-k, gap 0). Times are medians over the "
          "repetitions (reps); *t99* etc. = learner time (evaluation excluded) until the read-out "
          "first reaches 99 / 99.5 / 100% of f_greedy (— = never). Greedy times marked *ext* are "
          "extrapolated from the growth exponent fitted on the sizes where greedy ran.\n")
        for term in ("DiSF", "Facility", "Pair_simi"):
            cells = _cells(res, term)
            if not cells:
                continue
            fit = tg.get("greedy_fits", {}).get(term)
            a(f"### {term}\n")
            if fit:
                a(f"Greedy growth: time ∝ n^{fit['exponent']:.2f} (fitted on n = "
                  f"{', '.join(str(p[0]) for p in fit['points'])}).\n")
            a("| n | d | reps | greedy time | f_greedy | f_topk | paper best frac | paper best gap | "
              "paper t99 | t99.5 | t100 | steps/s | learner s | paper+polish frac | gap | total | ×greedy | "
              "topk+polish frac | total | ×greedy | greedy+polish frac |")
            a("|" + "---|" * 21)
            for c in cells:
                g = c["greedy"]
                gt = _s(g.get("wall_s")) + (" *ext*" if g.get("extrapolated") else "")
                p, pp, tp = c["paper"], c["paper+polish"], (c.get("topk+polish") or {})
                gp = c.get("greedy+polish") or {}
                tt = p["time_to"]
                a(f"| {c['n']} | {c['d']} | {c['reps']} | {gt} | {_f(g.get('f'), '.6f')} | {c['f_topk']:.6f} | "
                  f"{_pct(p['best_fraction'], 3)} | {_f(p['gap_closed_best'], '.3f')} | {_s(tt.get('0.99'))} | "
                  f"{_s(tt.get('0.995'))} | {_s(tt.get('1'))} | {p['steps_per_s']:.0f} | {_s(p['learner_s'])} | "
                  f"{_pct(pp['fraction'], 3)} | {_f(pp['gap_closed'], '.3f')} | {_s(pp['total_s'])} | "
                  f"{_f(pp.get('time_over_greedy'), '.3f')} | {_pct(tp.get('fraction'), 3)} | {_s(tp.get('total_s'))} | "
                  f"{_f(tp.get('time_over_greedy'), '.3f')} | {_pct(gp.get('fraction'), 3)} |")
            a("")
            a("Polish detail (paper+polish / topk+polish): "
              + "; ".join(f"n={c['n']}: {c['paper+polish']['swaps']} / {(c.get('topk+polish') or {}).get('swaps', '—')} swaps, "
                          f"polish {_s(c['paper+polish'].get('polish_s'))} / {_s((c.get('topk+polish') or {}).get('total_s'))}, "
                          f"converged {c['paper+polish']['converged']} / {(c.get('topk+polish') or {}).get('converged', '—')}"
                          for c in cells) + ".\n")
            big = [c for c in cells if c["greedy"].get("f") is None]
            if big:
                a("Where greedy was not run, f_greedy is unknown: paper+polish reached f = "
                  + ", ".join(f"{c['paper+polish']['f']:.6f} at n={c['n']} "
                              f"(gap over top-k {c['paper+polish']['f'] - c['f_topk']:+.6f}, "
                              f"{_s(c['paper+polish']['total_s'])} vs greedy {_s(c['greedy'].get('wall_s'))} ext)"
                              for c in big) + ".\n")

    tn = res.get("term_norm")
    if tn:
        a("## Term normalisation: none vs standardize (whole-shard f)\n")
        a(f"n = {tn['n']}, same learner settings and seed; f after the plain learner and after "
          "the polish.\n")
        a("| term | term_norm | f (paper) | f_qua | f_div | f (paper+polish) | learner s |\n|---|---|---|---|---|---|---|")
        for r in tn["rows"]:
            a(f"| {r['term']} | {r['term_norm']} | {r['f']:.6f} | {r['f_qua']:.5f} | {r['f_div']:.5f} | "
              f"{r['f_polished']:.6f} | {_s(r['learner_s'])} |")
        a("")
        for term, v in tn.get("verdict", {}).items():
            a(f"- {term}: {v}")
        a("")

    hw = res.get("hardware")
    if hw:
        pk = hw["peaks"]
        a("## Hardware efficiency\n")
        a(f"Peaks measured in this run on {hw['device']}: torch matmul {pk['matmul_size']}² fp32 "
          f"{pk['matmul_gflops']:.1f} GFLOP/s; memory copy {pk['copy_bytes'] >> 20} MiB "
          f"{pk['copy_gbps']:.1f} GB/s (read + write).\n")
        a("| kernel | bound | achieved | fraction of peak | note |\n|---|---|---|---|---|")
        for k in hw["kernels"]:
            if k.get("bound") == "compute":
                a(f"| {k['kernel']} | compute | {k['gflops']:.1f} GFLOP/s | {_pct(k['fraction_of_matmul'], 0)} of matmul | {k['note']} |")
            else:
                a(f"| {k['kernel']} | memory | {k['gbps']:.1f} GB/s | {_pct(k['fraction_of_copy'], 0)} of copy | {k['note']} |")
        a("")
        if hw.get("objective_share"):
            a("Learner time inside vs outside the objective (engine.learner.score timed in place):\n")
            a("| term | n | G | batch m | steps/s | inside objective | outside (sampling, batching, update) |\n|---|---|---|---|---|---|---|")
            for r in hw["objective_share"]:
                a(f"| {r['term']} | {r['n']} | {r['G']} | {r['m']} | {r['steps_per_s']:.0f} | "
                  f"{_pct(r['objective_share'], 0)} | {_pct(1 - r['objective_share'], 0)} |")
            a("")
    ts = (hw or {}).get("thread_scaling")
    if ts:
        a(f"Thread scaling under this run's load (loadavg {ts['loadavg']} on {ts['cpu_count']} CPUs): "
          f"learner ({ts['steps']} DiSF steps, n={ts['n']}) {ts['learner_speedup_all_vs_1']:.2f}× and "
          f"1024² matmul {ts['matmul_speedup_all_vs_1']:.2f}× faster with {ts['cpu_count']} threads than with 1 "
          "(< 1 means slower: intra-op threads spin-waiting for cores held by other processes).\n")
    sp = res.get("speedups")
    if sp:
        a("## Make it fast: before / after (interleaved, medians)\n")
        a("| what | before | after | speed-up |\n|---|---|---|---|")
        for r in sp:
            a(f"| {r['what']} | {r['before_s'] * 1e3:.2f} ms | {r['after_s'] * 1e3:.2f} ms | {r['speedup']:.2f}× |")
        a("")
    p = res.get("pipeline")
    if p:
        a("## Pipeline overhead\n")
        if p.get("skipped"):
            a(f"Skipped: {p['skipped']}\n")
        else:
            a(f"One {p['rows']}-row, {p['dim']}-d shard, preset {p.get('preset', 'cpu-demo')} ({p['config']['algorithm']}, "
              f"{p['config']['n_epochs']} steps, G={p['config']['n_rollout']}, partial "
              f"{p['config']['partial']}, solver {p['config']['solver']}), {p['reps']} rep(s), "
              f"executor: {p['executor']}.\n")
            a("| | seconds |\n|---|---|")
            a(f"| engine CLI process (read, learn, write, evaluate) | {_s(p['engine_cli_wall_s'])} |")
            a(f"| of which learning | {_s(p.get('engine_learn_s'))} |")
            a(f"| Dagster: one partition materialized (demo's per-shard time) | {_s(p['dagster_shard_materialize_s'])} |")
            a(f"| Dagster demo process (incl. imports, registration, corpus summary) | {_s(p['dagster_demo_wall_s'])} |")
            a(f"\nAdded by Dagster: {_pct(p.get('added_fraction_shard'), 1)} per shard, "
              f"{_pct(p.get('added_fraction_process'), 1)} for the whole demo process.\n")
            if p.get("errors"):
                a("Errors: " + "; ".join(p["errors"]) + "\n")
    pe = res.get("peer")
    if pe:
        a("## Outside peer: apricot-select (facility location, λ = 0)\n")
        if pe.get("skipped"):
            a(f"Skipped: {pe['skipped']}\n")
        else:
            a(f"n = {pe['n']}, d = {pe['d']}, k = {pe['k']}; apricot {pe['apricot_version']} on the same "
              "clipped-cosine similarity (precomputed); every f scored by engine.evaluate.\n")
            a("| who | rep | wall | whole-shard f |\n|---|---|---|---|")
            for r in pe["rows"]:
                a(f"| {r['who']} | {r['rep']} | {_s(r['wall_s'])} | {r['f']:.6f} |")
            a("")
    d = res.get("defaults")
    if d:
        a("## Default solver per term\n")
        a("The pipeline's default is `solver=auto`; what it picks per term and n comes from "
          "`python -m bench.solvers --write-table` (engine/solver_table.json, README \"Solvers\").\n")
        for term, v in d.items():
            a(f"- **{term}**: `{v['solver']}` [engine default `{v.get('engine_default', '?')}`] — {v['why']}")
        a("")
    notes = list(res.get("notes") or []) + list(STATIC_NOTES)
    a("## Notes and limits\n")
    for n_ in notes:
        a(f"- {n_}")
    a("")
    return "\n".join(L) + "\n"


STATIC_NOTES = (
    "Greedy's time where it was not run is extrapolated (marked *ext*): its f is then unknown, so "
    "f/f_greedy and time-to-target are reported only where greedy ran; larger sizes report the "
    "polished f against quality top-k and the extrapolated greedy time.",
    "The learner's batch is capped (max_batch): partial = min(0.05, max_batch/n), so large shards "
    "run at a smaller partial than the paper's 0.05–0.1 (the calibration run found the steps "
    "needed barely depend on partial). The cap is recorded per cell (learner_config.partial).",
    "paper+polish is measured as learn(solver='paper') followed by engine.polish.polish on its "
    "read-out, which is what learn(solver='paper+polish') runs at its end "
    "(tests/engine/test_polish.py checks the hook).",
    "With the batch capped, each logit is updated in only a `partial` share of the steps (1% at "
    "n = 10^5 with m = 1000), so a fixed step count teaches the learner less as n grows: its "
    "whole-shard gap over quality top-k shrinks and can turn negative at the largest sizes (see "
    "'paper best gap'); the polish result does not depend on it.",
    "Not measured here: an outside peer (apricot-select / submodlib) — not installed in this "
    "environment; Dagster's multiprocess executor (the definitions use the in-process executor); "
    "DuckDB validation and subset-writing throughput against raw parquet scans.",
    "bench/gpu.sh (the CUDA run on a 10^6 x 768 block) was written without a GPU and is untested.",
)


def _main(argv=None) -> int:
    """Re-render REPORT.md from a results JSON: python -m bench.report RESULTS.json"""
    import json
    import sys
    from pathlib import Path

    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 1:
        print("usage: python -m bench.report RESULTS.json", file=sys.stderr)
        return 2
    path = Path(args[0])
    res = json.loads(path.read_text())
    name = f"REPORT_{res['tag']}.md" if res.get("tag") else "REPORT.md"
    (path.parent / name).write_text(render(res))
    print(f"wrote {path.parent / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
