"""Throughput and peak memory of compare_arrays: chunked path vs the whole-array reference.

    python benchmarks/compare_throughput.py [--rows 1000000] [--cols 64]

Prints GB/s of reference data (float32 table bytes / seconds) for the whole-array reference
(tests/test_compare_chunked.py), the chunked `compare_arrays`, and numpy.allclose on the same
arrays, and each one's peak traced memory (tracemalloc, in a fresh subprocess) as a multiple
of the table's bytes.
"""
import argparse
import json
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

PATHS = ("reference", "chunked", "allclose")


def measure(path: str, rows: int, cols: int) -> dict:
    """One path's seconds and peak traced bytes beyond the two input tables."""
    from test_compare_chunked import reference_compare_arrays
    from verify.core.tolerances import Tolerance
    from verify.judge.compare import compare_arrays

    rng = np.random.default_rng(0)
    ref = rng.standard_normal((rows, cols), dtype=np.float32)
    cand = ref + (rng.standard_normal((rows, cols), dtype=np.float32) * np.float32(1e-6))
    tol = Tolerance(1e-6, 1e-5)
    run = {"reference": lambda: reference_compare_arrays(cand, ref, tol),
           "chunked": lambda: compare_arrays(cand, ref, tol),
           "allclose": lambda: np.allclose(cand, ref, rtol=tol.rtol, atol=tol.atol)}[path]
    tracemalloc.start()
    start = time.perf_counter()
    run()
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return {"seconds": seconds, "peak": peak, "bytes": ref.nbytes}


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
    table = results["chunked"]["bytes"]
    base = table / results["allclose"]["seconds"] / 1e9
    print(f"{args.rows} x {args.cols} float32 ({table / 1e6:.0f} MB)")
    for path, r in results.items():
        rate = table / r["seconds"] / 1e9
        print(f"{path:>9}: {rate:6.3f} GB/s ({rate / base:5.2f}x allclose), "
              f"peak {r['peak'] / table:5.2f}x the table's bytes")


if __name__ == "__main__":
    main()
