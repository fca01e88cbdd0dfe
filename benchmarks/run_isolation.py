"""What starting every run from a fresh process state costs, two ways.

1. Reset in place (what the suite does, `verify.runners.capture.process_state`): read every
   process-wide switch and put back those a run changed. Printed as a ratio of one run.
2. A fresh process per run: start Python, import TensorFlow and the case, run. Printed as the
   start-up's ratio to the same run in a warm process.

    python benchmarks/run_isolation.py [--case tpu_embedding] [--implementation tf2]
                                       [--repeats 5] [--steps 4]
"""
import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from verify.runners.case_sources import load_cases, resolve_sources  # noqa: E402
from verify.core.case import SuiteOptions  # noqa: E402
from verify.runners.capture.devices import configure_cpu_replicas  # noqa: E402
from verify.runners.capture.process_state import starting_fresh  # noqa: E402
from verify.runners.run import run_implementation  # noqa: E402

START_ONLY = """
import sys, time
started = time.perf_counter()
sys.path.insert(0, {root!r})
from verify.runners.case_sources import load_cases, resolve_sources
from verify.core.case import SuiteOptions
from verify.runners.capture.devices import configure_cpu_replicas
import tensorflow
configure_cpu_replicas()
load_cases(resolve_sources(["cases"], {root!r}), SuiteOptions(), [{case!r}])
print(time.perf_counter() - started)
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="tpu_embedding")
    parser.add_argument("--implementation", default="tf2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()

    configure_cpu_replicas()
    case = load_cases(resolve_sources(["cases"], ROOT), SuiteOptions(), [args.case])[args.case]
    implementation = case.implementation(args.implementation)
    run_implementation(case, implementation, steps=args.steps)   # warm: traced, imported
    runs, resets, starts = [], [], []
    for _ in range(args.repeats):
        started = time.perf_counter()
        run_implementation(case, implementation, steps=args.steps)
        runs.append(time.perf_counter() - started)
        started = time.perf_counter()
        starting_fresh()
        resets.append(time.perf_counter() - started)
        whole = time.perf_counter()
        inner = subprocess.run([sys.executable, "-c", START_ONLY.format(root=str(ROOT),
                                                                         case=args.case)],
                               capture_output=True, text=True, check=True, cwd=ROOT)
        starts.append(time.perf_counter() - whole)
        float(inner.stdout.strip().splitlines()[-1])   # it ran to the end
    run, reset, start = (statistics.median(x) for x in (runs, resets, starts))
    print(f"{args.case}/{args.implementation}, {args.steps} steps, medians of {args.repeats}")
    print(f"  one run (warm process)            {run:8.3f} s   runs: "
          + ", ".join(f"{x:.3f}" for x in runs))
    print(f"  reset in place                    {reset:8.4f} s = {reset / run:.4f}x a run"
          f"   resets: " + ", ".join(f"{x:.4f}" for x in resets))
    print(f"  a fresh process's start-up        {start:8.3f} s = {start / run:.1f}x a run"
          f"   starts: " + ", ".join(f"{x:.2f}" for x in starts))
    print(f"  target: reset <= 0.01x a run: {'met' if reset / run <= 0.01 else 'NOT met'}")


if __name__ == "__main__":
    main()
