"""Throughput of the custom-loop case under the harness: capture on against the plain seed loop.

For each replica count, the seed's loop (`verify.LoopRunner`, MirroredStrategy, 64 examples
per replica as in the seed) runs once as shipped (`capture_steps=False`: the user's loop,
weights read at epoch ends only) and once observed every step by the taps (the batch, the
loss, the applied gradients, weights and Adam slots sent to the host every step). Examples per
second are timed over the second of two epochs (the first traces the functions); the best of
`--repeats` alternating runs of each is kept, since other processes share the CPU. Prints a markdown table with the ratio captured / plain (target
>= 0.85).

    python benchmarks/loop_throughput.py               # about 2-3 minutes on 2 cores
    python benchmarks/loop_throughput.py --replicas 1,2 --steps 10 --repeats 1
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", default="1,2,4,8")
    parser.add_argument("--steps", type=int, default=25, help="timed steps per run, plus one")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args(argv)
    replica_counts = [int(r) for r in args.replicas.split(",")]

    from verify.runners.capture.devices import configure_cpu_replicas

    configure_cpu_replicas(8)
    from cases.custom_loop import FULL, SEED, build_case
    from cases.custom_loop.data import load_fashion_mnist
    from verify.runners.run import run_implementation

    print(f"{args.steps} timed steps (the second of two epochs), {FULL.batch_per_replica} "
          f"examples per replica, best of {args.repeats}\n")
    print("| replicas | plain seed loop (examples/s) | captured every step (examples/s) "
          "| ratio |\n|---|---|---|---|")
    for replicas in replica_counts:
        # two epochs of args.steps steps each; the second is timed (the first traces)
        examples = FULL.batch_per_replica * replicas * args.steps
        tier = dataclasses.replace(FULL, name="throughput", train_examples=examples,
                                   test_examples=64, epochs=2, variables_every=None)
        data = load_fashion_mnist(synthetic_seed=SEED, synthetic_counts=(examples, 64)).head(
            examples, 64)
        case = build_case(data, tier)
        impl = case.implementation(f"mirrored-x{replicas}")
        best = {False: 0.0, True: 0.0}
        for _ in range(args.repeats):
            for capture in (False, True):
                trace = run_implementation(case, impl, steps=2 * args.steps,
                                           capture_steps=capture)
                if trace.error:
                    raise SystemExit(f"{impl.name}: {trace.error}")
                best[capture] = max(best[capture], trace.meta.details["examples_per_second"])
        print(f"| {replicas} | {best[False]:.0f} | {best[True]:.0f} "
              f"| {best[True] / best[False]:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
