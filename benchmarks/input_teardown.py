"""Per-device input pipelines untuned / as TensorFlow builds them: the custom loop's mirrored
runs, wall time and CPU, on as few cores as a busy machine leaves a run.

Every run builds the per-device pipelines of its distributed datasets without tf.data's
autotuning (`verify.runners.capture.tf_internals.untuned_per_device_input`): with it, deleting
an iterator at an epoch's end can wait out an autotuning thread that missed its wake-up. The
stall needs the thread to be scheduled at the wrong moment, which a run sharing its cores makes
likely; so the process is pinned to `--cores` CPUs (default 1: the share of each of the two
xdist workers on a 2-core machine). Rounds alternate the two kinds, their order turning each
round (`baselines.rotated`); each round runs every implementation once of each kind.

    python benchmarks/input_teardown.py [--implementations mirrored-x2,mirrored-x4,mirrored-x8]
                                        [--rounds 3] [--cores 1]

Target (stated before measuring): untuned / as built wall <= 0.9x at one core, the median of the
rounds. The wall / CPU of each kind says how much of a run was spent waiting.
"""
import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from baselines import alternating_rounds  # noqa: E402
from targets import target_line  # noqa: E402

KINDS = ["as built", "untuned"]


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--implementations", default="mirrored-x2,mirrored-x4,mirrored-x8")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cores", type=int, default=1,
                        help="CPUs the process may use (0: all)")
    return parser.parse_args()


def pin(cores: int) -> list[int]:
    """Restrict this process (and every thread it starts from now on) to `cores` CPUs."""
    available = sorted(os.sched_getaffinity(0))
    if cores:
        os.sched_setaffinity(0, set(available[-cores:]))
    return sorted(os.sched_getaffinity(0))


def timed_runs(case, names: list[str], kind: str) -> tuple[float, float]:
    """Wall and CPU seconds of running `names` once each, as `kind`."""
    from verify.runners import run as run_module

    untuned = run_module.untuned_per_device_input
    if kind == "as built":
        run_module.untuned_per_device_input = contextlib.nullcontext
    try:
        wall, cpu = time.perf_counter(), time.process_time()
        for name in names:
            trace = run_module.run_implementation(case, case.implementation(name))
            if trace.error:
                raise SystemExit(f"{name} failed ({kind}): {trace.error.splitlines()[0]}")
        return time.perf_counter() - wall, time.process_time() - cpu
    finally:
        run_module.untuned_per_device_input = untuned


def main():
    args = parse()
    cpus = pin(args.cores)
    from verify.core.case import SuiteOptions
    from verify.runners.capture.devices import configure_cpu_replicas
    from verify.runners.case_sources import load_cases, resolve_sources

    configure_cpu_replicas()
    case = load_cases(resolve_sources([str(ROOT / "cases")]), SuiteOptions(),
                      ["custom_loop"])["custom_loop"]
    names = args.implementations.split(",")
    print(f"custom_loop {', '.join(names)}; CPUs {cpus}; {args.rounds} rounds")
    timed_runs(case, names[:1], "untuned")   # TensorFlow's first run pays its start once
    walls, _ = alternating_rounds(KINDS, args.rounds, lambda kind: timed_runs(case, names, kind))
    ratios = [u / b for u, b in zip(walls["untuned"], walls["as built"])]
    print(target_line(f"untuned / as built wall at {len(cpus)} CPU(s)", ratios, 0.9, "x",
                      at_most=True))


if __name__ == "__main__":
    main()
