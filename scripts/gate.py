#!/usr/bin/env python3
"""The performance gate's verdict (issue 34): reads a `timerdb-bench --compare` JSON (rows of
the reference build "old" and of HEAD "new", each with its runs, taken alternately) and fails
when a median of HEAD is worse than the reference's by more than the noise measured.

Which way is worse comes from the unit: a rate ("/s") is worse lower; a time, a size or a count
of errors is worse higher. The noise of a metric is the larger relative spread
((max - min) / median) of its runs in either build, and at least --floor (10 % by default):
on this shared 2-core machine one run can be off by that much for no reason of ours. A metric
measured by one build only (the reference may predate a workload: f71a9fa has no push), or with
a zero or missing median, is shown and not judged.

    scripts/gate.py bench-results/gate.json            table + verdict, exit 1 on a regression
    scripts/gate.py --self-test                        proves the verdict catches a planted slide
"""

import argparse
import json
import statistics
import sys


def worse_when_higher(unit: str) -> bool:
    return "/s" not in unit


def noise(runs, floor):
    runs = [r for r in runs if r is not None]
    if len(runs) < 2:
        return floor
    med = statistics.median(runs)
    if med == 0:
        return floor
    return max(floor, (max(runs) - min(runs)) / abs(med))


def judge(rows, floor):
    """Returns (lines of a Markdown table, number of regressions)."""
    old = {(r["workload"], r["params"], r["metric"]): r for r in rows if r["build"] == "old"}
    new = {(r["workload"], r["params"], r["metric"]): r for r in rows if r["build"] == "new"}
    lines = [
        "| workload | parameters | metric | reference | HEAD | HEAD ÷ ref | noise | verdict |",
        "|---|---|---|---:|---:|---:|---:|---|",
    ]
    regressions = 0
    # A configuration a build could not run (a metric without a median: the reference has no
    # push) is shown, not judged: its zeros mean "did not run", not "no lateness".
    missing = {k[:2] for k, r in list(old.items()) + list(new.items()) if r["median"] is None}
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if key[:2] in missing:
            lines.append(f"| {key[0]} | {key[1]} | {key[2]} | "
                         f"{a['median'] if a else '—'} | {b['median'] if b else '—'} | | | not run by both |")
            continue
        if (a is not None and b is not None and a["median"] == 0 and b["median"]
                and worse_when_higher(a["unit"])):
            # None before, some now (errors, timers not delivered): worse whatever the noise.
            regressions += 1
            lines.append(f"| {key[0]} | {key[1]} | {key[2]} ({a['unit']}) | 0 | "
                         f"{b['median']:.4g} | | | WORSE |")
            continue
        if a is None or b is None or not a["median"] or b["median"] is None:
            lines.append(f"| {key[0]} | {key[1]} | {key[2]} | "
                         f"{a['median'] if a else '—'} | {b['median'] if b else '—'} | | | not judged |")
            continue
        ratio = b["median"] / a["median"]
        tol = max(noise(a["runs"], floor), noise(b["runs"], floor))
        if worse_when_higher(a["unit"]):
            bad = ratio > 1 + tol
        else:
            bad = ratio < 1 - tol
        regressions += bad
        verdict = "WORSE" if bad else "ok"
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} ({a['unit']}) | {a['median']:.4g} | "
                     f"{b['median']:.4g} | ×{ratio:.2f} | ±{tol:.0%} | {verdict} |")
    return lines, regressions


def self_test(floor):
    def row(build, metric, unit, runs):
        return {"build": build, "workload": "w", "params": "p", "metric": metric,
                "unit": unit, "median": statistics.median(runs), "runs": runs}
    same = [row("old", "rate", "timers/s", [100, 104, 98]), row("new", "rate", "timers/s", [99, 103, 101]),
            row("old", "p99", "ms", [20, 22, 21]), row("new", "p99", "ms", [21, 20, 22])]
    _, n = judge(same, floor)
    assert n == 0, "equal builds judged worse"
    slid = [row("old", "rate", "timers/s", [100, 104, 98]), row("new", "rate", "timers/s", [57, 60, 58]),
            row("old", "p99", "ms", [20, 22, 21]), row("new", "p99", "ms", [36, 34, 35])]
    _, n = judge(slid, floor)
    assert n == 2, f"a 40 % slide caught {n} of 2 times"
    noisy = [row("old", "rate", "timers/s", [100, 60, 140]), row("new", "rate", "timers/s", [80, 70, 90])]
    _, n = judge(noisy, floor)
    assert n == 0, "a difference inside the measured noise was judged worse"
    errors = [row("old", "errors", "calls", [0, 0, 0]), row("new", "errors", "calls", [0, 3, 5])]
    _, n = judge(errors, floor)
    assert n == 1, "errors where the reference had none were not judged worse"
    print("gate.py self-test: a planted slide is caught, equal and noisy builds pass")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("json", nargs="?")
    p.add_argument("--floor", type=float, default=0.10)
    p.add_argument("--self-test", action="store_true")
    args = p.parse_args()
    if args.self_test:
        self_test(args.floor)
        return 0
    with open(args.json) as f:
        rows = json.load(f)["rows"]
    lines, regressions = judge(rows, args.floor)
    print("\n".join(lines))
    print(f"\ngate: {regressions} metric(s) worse than the reference beyond the noise")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
