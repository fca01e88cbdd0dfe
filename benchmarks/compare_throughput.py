"""Throughput and peak memory of compare_arrays: the compiled kernel, the numpy chunked path
and numpy.allclose on the same arrays, and sparse gradients compared on their rows.

    python benchmarks/compare_throughput.py [--rows 1000000] [--cols 64]

Prints GB/s of reference data (float32 table bytes / seconds) for numpy.allclose, the numpy
chunked path (`compare_arrays` with the kernel turned off), the kernel (numba), the kernel
under a noise-floor cap (`Tolerance.with_floor`: the floor from max |reference|, found in the
scan's own read, `verify/judge/scan_deferred.py`), and a sparse gradient touching rows/20 rows
(repeated ids) compared on its rows by the kernel (GB/s of the dense table's bytes); a read of
the reference alone for max |reference| (what a capped comparison reads first where the scan
cannot find it itself: a NaN or Inf in either array); a bitwise-equal pair (the fast path)
against one numpy.array_equal; the ceiling: one compiled pass that only sums the differences,
the least any comparison reads; the float64 sums of squares alone (what rel_l2 needs of every
element and nothing else: the least any comparison that keeps rel_l2 computes); the kernel's
ratio to allclose; then each target as a share of that ceiling (dense passes, capped and
uncapped, >= 0.8; sparse rows >= 0.5 in GB/s of the reference's rows; a bitwise-equal pair at
>= 0.8 of one numpy.array_equal's speed) as met or NOT met, with the median and every round's
figure. Each path runs in a fresh subprocess: peak traced memory (tracemalloc, which does not
see numba's own allocations; the kernel allocates nothing large) and the peak RSS growth
(getrusage) as multiples of the table's bytes, on the first call (which also pays for touching
fresh memory); then 3 untraced rounds, each one call of the ceiling on the same dense tables
and then one call of the path: a round's share of the ceiling compares two calls made at the
same moment of a shared machine. The kernel is compiled (or loaded from numba's cache) on a
tiny array before timing; that time is printed once.

Measured (2 cores shared with other jobs, 1M x 64 float32, 256 MB): see docs/development.md's
benchmark section for the figures of the last run.
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from targets import target_line  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

PATHS = ("allclose", "numpy", "kernel", "capped", "sparse", "equal", "array_equal", "ceiling",
         "squares", "scale")


def read_both_ceiling():
    """The least a comparison can do: one compiled read of both arrays (the sum of their
    differences), what this core's memory gives two-array passes."""
    import numba

    @numba.njit(fastmath=True)
    def sum_of_differences(a, b):
        total = a.dtype.type(0)
        for i in range(a.size):
            total += a[i] - b[i]
        return total

    return sum_of_differences


def squares_floor():
    """The float64 work no comparison of every element can skip: the sums of squares of the
    reference and of the difference that rel_l2 needs (float64 from each float32 pair, summed
    in any order, fused multiply-adds allowed), and nothing else."""
    import numba

    @numba.njit(fastmath={"reassoc", "contract"})
    def sums_of_squares(a, b):
        part_b = part_d = 0.0
        for i in range(a.size):
            y = np.float64(b[i])
            d = np.float64(a[i]) - y
            part_b += y * y
            part_d += d * d
        return part_b, part_d

    return sums_of_squares


def measure(path: str, rows: int, cols: int) -> dict:
    """One path's seconds, peak traced bytes and peak RSS growth beyond the input tables."""
    import resource

    from verify.core.tolerances import Tolerance
    from verify.core.trace import SparseRows
    from verify.judge import arrays, compare_engine

    compile_seconds = 0.0
    if path in ("ceiling", "squares"):
        reference_pass = read_both_ceiling() if path == "ceiling" else squares_floor()
        reference_pass(np.ones(4, np.float32), np.ones(4, np.float32))   # compiled, not timed
    if path in ("kernel", "capped", "sparse", "equal", "scale"):
        start = time.perf_counter()
        assert compare_engine.comparison_engine() == "numba", "numba is not installed"
        tiny = np.ones(compare_engine.KERNEL_ABOVE + 1, np.float32)
        arrays.compare_arrays(tiny, tiny, Tolerance(1e-6, 1e-5).with_floor(1e-7, 10.0))
        arrays.compare_arrays(tiny + np.float32(1e-7), tiny,
                              Tolerance(1e-6, 1e-5).with_floor(1e-7, 10.0))
        arrays.compare_arrays(tiny, tiny, Tolerance(1e-6, 1e-5))
        compile_seconds = time.perf_counter() - start
    else:
        compare_engine._kernel = False   # the numpy path, as without numba
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((rows, cols), dtype=np.float32)
    cand = ref + (rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(1e-6))
    tol = Tolerance(1e-6, 1e-5)
    if path in ("equal", "array_equal"):
        same = ref.copy()      # a faithful pair that trained bitwise the same numbers
    if path == "sparse":
        touched = max(1, rows // 20)
        ids = rng.integers(0, rows, size=touched)
        grad = rng.standard_normal((touched, cols), dtype=np.float32)
        sparse_ref = SparseRows(ids, grad, (rows, cols))
        sparse_cand = SparseRows(ids[::-1].copy(), grad[::-1].copy(), (rows, cols))
    run = {"allclose": lambda: np.allclose(cand, ref, rtol=tol.rtol, atol=tol.atol),
           "numpy": lambda: arrays.compare_arrays(cand, ref, tol),
           "kernel": lambda: arrays.compare_arrays(cand, ref, tol),
           "capped": lambda: arrays.compare_arrays(cand, ref, tol.with_floor(1e-7, 10.0)),
           "sparse": lambda: arrays.compare_values(sparse_cand, sparse_ref, tol),
           "equal": lambda: arrays.compare_arrays(same, ref, tol.with_floor(1e-7, 10.0)),
           "array_equal": lambda: np.array_equal(same, ref),
           "ceiling": lambda: reference_pass(cand.reshape(-1), ref.reshape(-1)),
           "squares": lambda: reference_pass(cand.reshape(-1), ref.reshape(-1)),
           "scale": lambda: compare_engine.reference_scale(ref.reshape(-1), np.float64,
                                                            compare_engine.compiled_scan())}[path]
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tracemalloc.start()          # memory on the first call (tracemalloc slows allocations)
    run()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - rss_before
    # then the median of 3 calls, untraced, each after one call of the ceiling on the same
    # tables: a round's ratio of the two sees the same moment of a shared machine
    both = cand.reshape(-1), ref.reshape(-1)   # the sparse path too: the dense tables
    ceiling = read_both_ceiling()
    ceiling(*both)
    timings, ceilings = [], []
    for _ in range(3):
        start = time.perf_counter()
        ceiling(*both)
        ceilings.append(time.perf_counter() - start)
        start = time.perf_counter()
        run()
        timings.append(time.perf_counter() - start)
    seconds = sorted(timings)[1]
    return {"seconds": seconds, "timings": timings, "ceilings": ceilings, "peak": peak,
            "rss": rss, "bytes": rows * cols * 4, "compile": compile_seconds}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--cols", type=int, default=64)
    parser.add_argument("--one", choices=PATHS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.rows, args.cols)))
        return
    results = {}
    for path in PATHS:
        out = subprocess.run([sys.executable, __file__, "--one", path, "--rows", str(args.rows),
                              "--cols", str(args.cols)], check=True, capture_output=True,
                             text=True).stdout
        results[path] = json.loads(out.strip().splitlines()[-1])
    table = results["numpy"]["bytes"]
    base = table / results["allclose"]["seconds"] / 1e9
    print(f"{args.rows} x {args.cols} float32 ({table / 1e6:.0f} MB); kernel compile or cache "
          f"load {results['kernel']['compile']:.2f} s (not timed below)")
    touched_rows = max(1, args.rows // 20) * args.cols * 4 * 2   # ids repeat: both sides' rows
    rates = {}
    for path, r in results.items():
        if path == "sparse":
            print("sparse gradient of rows/20 ids a side, compared on its rows: GB/s of the "
                  "reference's rows (the target's measure), and of the dense table's bytes:")
        size = touched_rows // 2 if path == "sparse" else table
        rates[path] = size / r["seconds"] / 1e9
        extra = (f", {table / r['seconds'] / 1e9:.3f} GB/s of the dense table"
                 if path == "sparse" else "")
        print(f"{path:>9}: {rates[path]:6.3f} GB/s ({rates[path] / base:5.2f}x allclose{extra}), "
              f"peak traced {r['peak'] / table:5.2f}x, peak RSS growth {r['rss'] / table:5.2f}x "
              f"the table")
    cost = results["equal"]["seconds"] / results["array_equal"]["seconds"]
    print(f"bitwise-equal tables: {cost:.2f}x the time of one numpy.array_equal read of both, "
          f"{results['kernel']['seconds'] / results['equal']['seconds']:.1f}x faster than the "
          f"kernel's full pass on a near-equal pair")
    # shares of the ceiling, a figure per round: each timed call against the ceiling's call
    # just before it in the same process; every line below quotes these paired figures
    def shares(path):
        size = touched_rows // 2 if path == "sparse" else table
        return [size / t / (table / c) for t, c in zip(results[path]["timings"],
                                                       results[path]["ceilings"])]

    share = {path: statistics.median(shares(path)) for path in results}
    print(f"the kernel runs at {share['kernel']:.0%} and under a cap at {share['capped']:.0%} of "
          f"this core's two-array read ({rates['ceiling']:.2f} GB/s of reference, the ceiling of "
          f"any comparison here)")
    print(f"the float64 sums of squares alone (rel_l2's, which every element adds) run at "
          f"{share['squares']:.0%} of the ceiling: no comparison that keeps rel_l2 in float64 "
          f"is faster")
    # the extra read's time as a multiple of the ceiling's, from the same rounds
    scale = statistics.median(t / c for t, c in zip(results["scale"]["timings"],
                                                    results["scale"]["ceilings"]))
    bound = 1 / (1 + scale)
    print(f"a capped comparison finds max |reference| (its noise floor) in the scan's own read; "
          f"where it cannot (a NaN or Inf), it reads the reference alone first: "
          f"{results['scale']['seconds'] * 1e3:.1f} ms, {scale:.2f}x the ceiling's time, which "
          f"would hold it to {bound:.0%} of the ceiling; it ran at {share['capped']:.0%}")
    # the targets (per core: every path runs on one)
    for path, target in (("kernel", 0.8), ("capped", 0.8), ("sparse", 0.5)):
        print(target_line(f"{path} comparison, share of the ceiling", shares(path), target, "",
                          at_most=False))
    print(target_line("bitwise-equal pair, share of one numpy.array_equal's speed",
                      [a / e for e, a in zip(results["equal"]["timings"],
                                             results["array_equal"]["timings"])], 0.8, "",
                      at_most=False))

if __name__ == "__main__":
    main()
