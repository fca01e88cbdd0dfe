"""The scale case (recsys_scale) at its size: capture overhead of tables by touched rows and
whole, peak memory of comparing its traces, and the comparison's throughput.

Prints ratios measured in this run:
- capture overhead: run seconds with capture / the same steps uninstrumented, per side, for
  tables captured by touched rows (target <= 1.3x) and whole every step (for comparison); the
  TF2 baseline is a plain `model.fit` that reads nothing between steps (`bare_keras_fit`);
- peak RSS of loading and comparing tf1 against tf2 (a fresh process), above the process's
  RSS before (after its imports and the comparison kernel's compilation, costs that do not
  grow with the traces), as a multiple of the bytes of the case's largest table (target
  <= 3x);
- comparison throughput: bytes of reference values compared per second, in a fresh process
  once the kernels the pair uses are loaded (and the first comparison's, which loads them).

Each run's user and system CPU seconds and minor page faults are printed beside its wall
time: on a virtual machine whose page faults are slow, fresh memory (a table read whole, or
written to disk) can cost more system time than the capture's own work costs user time.

    python benchmarks/scale_capture.py [--full] [--steps N] [--repeats 5]
"""
import argparse
import contextlib
import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from baselines import bare_keras_fit, rotated  # noqa: E402
from targets import target_line  # noqa: E402


def quiet():
    import logging

    logging.getLogger("tensorflow").setLevel(logging.ERROR)
    import tensorflow as tf

    tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)


def with_capture(impl, capture_tables, every):
    runner = impl.runner.resolve()
    return dataclasses.replace(impl, runner=dataclasses.replace(
        runner, capture_tables=capture_tables, tables_every=every))


def timed(case, impl, capture, costs: list | None = None):
    """One run: its seconds and trace; with `costs`, its (user CPU s, system CPU s, minor page
    faults) appended to it."""
    from verify.runners.run import run_implementation

    before = resource.getrusage(resource.RUSAGE_SELF)
    trace = run_implementation(case, impl, capture_steps=capture)
    after = resource.getrusage(resource.RUSAGE_SELF)
    if trace.error:
        raise SystemExit(f"{impl.name} failed: {trace.error}")
    if costs is not None:
        costs.append((after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime,
                      after.ru_minflt - before.ru_minflt))
    return trace.meta.seconds, trace


def compare_in_fresh_process(reference: Path, candidate: Path) -> dict:
    """Load and compare two saved traces in a new process: its peak RSS above its RSS before."""
    code = f"""
import json, time
from verify.core.trace import Trace
from verify.judge.compare import compare_traces

def status(field):   # KiB; ru_maxrss would carry the parent's peak over fork + exec
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])

# the fixed costs first, apart from what grows with the traces: numba's import and the kernel
# compiled (or loaded from its cache) for writable and read-only (mapped) arrays
import numpy as np
from verify.core.tolerances import Tolerance
from verify.judge.arrays import compare_arrays
from verify.judge.compare_engine import KERNEL_ABOVE
for dtype in (np.float32, np.float64):
    x = np.zeros(KERNEL_ABOVE + 1, dtype)
    ro = x.copy()
    ro.flags.writeable = False
    for a, b in ((x, x), (ro, ro), (x, ro), (ro, x)):
        compare_arrays(a, b, Tolerance(1e-6, 1e-5))
before = status("VmRSS")
started = time.perf_counter()
ref, cand = Trace.load({str(reference)!r}), Trace.load({str(candidate)!r})
loaded = time.perf_counter()
rows = compare_traces(ref, cand)
done = time.perf_counter()
peak = status("VmHWM")
nbytes = sum(getattr(v, 'nbytes', 0) or getattr(getattr(v, 'rows', None), 'nbytes', 0)
             for v in ref.values.values())
# again, on traces loaded anew: the comparison's own speed, once every kernel this pair uses
# is loaded in the process (the first comparison also loaded the sparse and touched-row
# kernels' specializations for read-only arrays from numba's cache)
ref, cand = Trace.load({str(reference)!r}), Trace.load({str(candidate)!r})
again = time.perf_counter()
compare_traces(ref, cand)
steady = time.perf_counter() - again
print(json.dumps({{"rss_kib": peak - before, "load_s": loaded - started,
                   "compare_s": done - loaded, "steady_s": steady, "reference_bytes": nbytes,
                   "rows": len(rows), "passed": bool(rows["passed"].all())}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    if out.returncode:
        raise SystemExit(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the 1M-row table, 100 steps")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from verify.runners.capture.devices import configure_cpu_replicas

    configure_cpu_replicas()
    quiet()
    from cases.recsys_scale import TABLES_EVERY, make_case
    from verify.runners.run import declared_config

    case = make_case(full=args.full, steps=args.steps)
    every = TABLES_EVERY[args.full]
    largest = max(v.nbytes for v in case.initial_values.values())
    print(f"recsys_scale: {case.description}; largest table {largest / 2**20:.0f} MiB")
    traces = {}
    with bare_keras_fit():   # warm-up: TF's start in this process (the runner's own
        # uninstrumented run would read every table at every step: 51 GB at --full)
        timed(case, case.implementation("tf2"), False)
    with tempfile.TemporaryDirectory(prefix="scale-bench-") as tmp:
        for name in ("tf1", "tf2"):
            impl = case.implementation(name)
            runs = {"off": [], "touched": [], "whole": []}
            costs = {"off": [], "touched": []}
            touched_impl = with_capture(impl, "touched_rows", every)
            whole_impl = with_capture(impl, "whole", None)
            for side in (impl, touched_impl, whole_impl):   # read once, after a run's timing
                declared_config(case, side)                 # (not in any run's CPU time)
            plain = bare_keras_fit if name == "tf2" else contextlib.nullcontext
            kinds = ["off", "touched"] + ([] if args.full else ["whole"])
            for round_ in range(args.repeats):   # interleaved, the order turning each round:
                for kind in rotated(kinds, round_):   # the machine's drift hits all alike
                    if kind == "off":
                        with plain():
                            runs["off"].append(timed(case, impl, False, costs["off"])[0])
                    elif kind == "touched":
                        seconds, trace = timed(case, touched_impl, True, costs["touched"])
                        runs["touched"].append(seconds)
                    else:
                        runs["whole"].append(timed(case, whole_impl, True)[0])
            traces[name] = trace.save(Path(tmp) / name, compress=False)
            off = statistics.median(runs["off"])
            touched = statistics.median(runs["touched"])
            whole = statistics.median(runs["whole"]) if runs["whole"] else float("nan")
            user = (statistics.median(c[0] for c in costs["touched"])
                    / statistics.median(c[0] for c in costs["off"]))
            print(f"  {name}: capture overhead (median of {args.repeats}), touched rows "
                  f"{touched / off:.2f}x, whole tables every step "
                  f"{whole / off:.2f}x; user CPU time of touched rows {user:.2f}x")
            # the targets, each repeat's instrumented run against the uninstrumented run of
            # the same round (wall and user CPU)
            print("    " + target_line(f"{name} touched-row capture, wall",
                                       [t / o for t, o in zip(runs["touched"], runs["off"])],
                                       1.1, "x", at_most=True))
            print("    " + target_line(f"{name} touched-row capture, user CPU",
                                       [t[0] / o[0] for t, o in zip(costs["touched"],
                                                                    costs["off"])],
                                       1.1, "x", at_most=True))
            for label in ("off", "touched"):
                print(f"    {'uninstrumented' if label == 'off' else 'touched rows':>14}: "
                      + "; ".join(f"{s:.2f} s (user {u:.2f}, system {k:.2f} s, "
                                  f"{f // 1000}K minor faults)"
                                  for s, (u, k, f) in zip(runs[label], costs[label])))
        got = compare_in_fresh_process(traces["tf1"], traces["tf2"])
        ratio = got["rss_kib"] * 1024 / largest
        verdict = ("met" if ratio <= 3 else "NOT met") if args.full else \
            "a target for the 1M-row table of --full; here fixed costs weigh more"
        print(f"  compare tf1 vs tf2 ({got['rows']} rows, all passed: {got['passed']}): peak RSS "
              f"{ratio:.2f}x the largest table (target <= 3x: {verdict}); load "
              f"{got['load_s']:.2f} s, compare "
              f"{got['reference_bytes'] / got['steady_s'] / 1e9:.3f} GB/s of reference values "
              f"({got['reference_bytes'] / got['compare_s'] / 1e9:.3f} GB/s the first time in "
              f"the process, loading kernels from numba's cache)")


if __name__ == "__main__":
    main()
