"""Capture overhead: instrumented run time / the same steps uninstrumented, for each side.

Target: <= 1.1x (issue "Speed near the limits"). Prints ratios measured in this run (never
absolute seconds as a target): per side, the ratio of the medians and each repeat's ratio
(instrumented and uninstrumented runs paired in the order they ran).

    python benchmarks/capture_overhead.py [--steps 200] [--repeats 3]
"""
import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verify.runners.capture.devices import configure_cpu_replicas  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from targets import target_line  # noqa: E402


def timed(case, impl, steps, capture, repeats) -> list[float]:
    from verify.runners.run import run_implementation

    seconds = []
    for _ in range(repeats):
        trace = run_implementation(case, impl, steps=steps, capture_steps=capture)
        if trace.error:
            raise SystemExit(f"{impl.name} failed: {trace.error}")
        seconds.append(trace.meta.seconds)
    return seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    configure_cpu_replicas()
    from cases.tpu_embedding import CASE

    case = CASE
    tf2 = case.implementation("tf2")
    tf2_spe1 = dataclasses.replace(tf2, runner=dataclasses.replace(tf2.runner.resolve(),
                                                                   steps_per_execution=1))
    rows = [("tf1 TPUEstimator (hook every step vs none)", case.implementation("tf1"), None),
            ("tf2 Keras fit, steps_per_execution=1 both", tf2_spe1, None),
            ("tf2 Keras fit as shipped, steps_per_execution=10 both (taps inside the "
             "multi-step function)", tf2, None)]
    timed(case, tf2_spe1, 5, True, 1)  # warm-up: first tf.function traces in the process
    print(f"capture overhead over {args.steps} steps, median of {args.repeats} runs each")
    for label, instrumented, plain in rows:
        on = timed(case, instrumented, args.steps, True, args.repeats)
        off = timed(case, plain or instrumented, args.steps, False, args.repeats)
        ratio = statistics.median(on) / statistics.median(off)
        print(f"  {label}: {ratio:.2f}x the uninstrumented run (medians)")
        print("    " + target_line(label.split(" (")[0] + " capture",
                                   [a / b for a, b in zip(on, off)], 1.1, "x", at_most=True))


if __name__ == "__main__":
    main()
