"""Measure how far the custom-loop case's faithful runs drift, to set its tolerances.

For N = 1, 2, 4, 8 replicas: the seed's loop under MirroredStrategy against the single-device
reference fed the same global batches, for 100 steps (over the first 3,200 training examples,
16 per replica); then the iteration styles and the checkpoint round trip against the for
loop at 2 replicas, and the negative controls of the quick tier with the margin by which each
is caught (`tightest_rtol / rtol` at its first divergence). Prints markdown tables.

    python benchmarks/replica_drift.py                # about 3-5 minutes on 2 cores
    python benchmarks/replica_drift.py --steps 20 --replicas 1,2 --no-controls

Drift per quantity is the worst over the case's tensors: `max_abs` = max |candidate - ref|,
`rtol needed` = the smallest rtol that passes with the case's atol (compare.py's
`tightest_rtol`).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

QUANTITIES = ("loss", "grad", "slot", "weight", "metric")


def drift_at(rows, steps, horizon):
    """{(quantity, column): (max_abs, rtol needed)} at `steps`, worst within `horizon` steps,
    and worst over the run."""
    out = {}
    for quantity, by_quantity in rows.groupby("quantity"):
        for step in steps:
            at = by_quantity[by_quantity["step"] == step]
            if not at.empty:
                out[(quantity, step)] = (at["max_abs"].max(), at["tightest_rtol"].max())
        for column, part in (("quick", by_quantity[by_quantity["step"] <= horizon]),
                             ("worst", by_quantity)):
            if not part.empty:
                out[(quantity, column)] = (part["max_abs"].max(), part["tightest_rtol"].max())
    return out


def print_table(title, columns, lines):
    print(f"### {title}\n")
    print("| pair | " + " | ".join(columns) + " |")
    print("|---" * (1 + len(columns)) + "|")
    for line in lines:
        print("| " + " | ".join(line) + " |")
    print("\ncells: max_abs / rtol needed with the case's atol\n")


def cell(drift, key):
    abs_, rel = drift.get(key, (float("nan"), float("nan")))
    return f"{abs_:.2g} / {rel:.2g}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--replicas", default="1,2,4,8")
    parser.add_argument("--no-controls", action="store_true")
    args = parser.parse_args(argv)
    replica_counts = [int(r) for r in args.replicas.split(",")]

    from verify.runners.capture.devices import configure_cpu_replicas

    configure_cpu_replicas(8)
    from cases.custom_loop import QUICK, SEED, build_case
    from cases.custom_loop.data import load_fashion_mnist
    from verify.judge.compare import compare_traces
    from verify.runners.run import run_implementation
    from verify.judge.verdict import judge

    tier = dataclasses.replace(QUICK, name="drift", train_examples=3200, epochs=4)
    data = load_fashion_mnist(synthetic_seed=SEED, synthetic_counts=(3200, 256)).head(3200, 256)
    case = build_case(data, tier, steps=args.steps)
    print(f"data: {data.source}; {args.steps} steps, {tier.batch_per_replica} per replica\n")
    print("tolerances (atol, rtol): " + ", ".join(
        f"{q} {t.atol:g}/{t.rtol:g}" for q, t in case.tolerances.by_quantity.items()) + "\n")
    checkpoints = [s for s in (1, 10, 100) if s <= args.steps]
    traces = {}

    def trace(name):
        if name not in traces:
            traces[name] = run_implementation(case, case.implementation(name), steps=args.steps)
            if traces[name].error:
                print(f"{name}: {traces[name].error}")
        return traces[name]

    quick_data = load_fashion_mnist(synthetic_seed=SEED, synthetic_counts=(640, 256)).head(640, 256)
    quick = build_case(quick_data, QUICK)

    def horizon(candidate):
        return min(quick.steps, QUICK.epochs * QUICK.steps_per_epoch(
            quick_data, case.implementation(candidate).replicas))

    def table(title, pairs):
        columns = [f"{q} @{s}" for q in QUANTITIES[:4] for s in [*checkpoints, "quick", "worst"]]
        lines = []
        for reference, candidate in pairs:
            rows = compare_traces(trace(reference), trace(candidate), case.tolerances)
            drift = drift_at(rows, checkpoints, horizon(candidate))
            lines.append([f"{reference} → {candidate} (quick: {horizon(candidate)} steps)"]
                         + [cell(drift, (q, s)) for q in QUANTITIES[:4]
                            for s in [*checkpoints, "quick", "worst"]])
        print_table(title, columns, lines)

    table(f"MirroredStrategy against one device, {args.steps} steps",
          [(f"reference-x{n}", f"mirrored-x{n}") for n in replica_counts])
    if 2 in replica_counts:
        table(f"Iteration styles and checkpoint round trip (2 replicas), {args.steps} steps",
              [("mirrored-x2", "mirrored-x2-iterator"),
               ("mirrored-x2", "mirrored-x2-epoch-function"),
               ("mirrored-x2", "mirrored-x2-restored")])

    quick_traces = {}

    def quick_trace(name):
        if name not in quick_traces:
            quick_traces[name] = run_implementation(quick, quick.implementation(name))
        return quick_traces[name]

    lines = []
    for reference, candidate in quick.all_pairs():
        impl = quick.implementation(candidate)
        if impl.expect is not None or impl.replicas not in replica_counts:
            continue
        rows = compare_traces(quick_trace(reference), quick_trace(candidate), quick.tolerances)
        drift = drift_at(rows, [], quick.steps)
        lines.append([f"{reference} → {candidate}"] + [cell(drift, (q, "worst"))
                                                       for q in QUANTITIES])
    print_table("The quick tier as the suite runs it: worst drift of the faithful pairs",
                list(QUANTITIES), lines)
    if args.no_controls:
        return 0
    print("### Negative controls (quick tier): margin = tightest_rtol / rtol at the divergence\n")
    print("| control | verdict | first divergence | margin |\n|---|---|---|---|")
    for reference, candidate in quick.all_pairs():
        impl = quick.implementation(candidate)
        if impl.expect is None or impl.replicas not in replica_counts:
            continue
        rows = compare_traces(quick_trace(reference), quick_trace(candidate), quick.tolerances)
        verdict = judge(rows, impl.expect)
        d = verdict.divergence
        where = f"step {d.step} {d.quantity} {d.tensor}" if d else "-"
        print(f"| {candidate} | {verdict.status} | {where} | {verdict.margin:.3g} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
