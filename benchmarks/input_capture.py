"""What the canonical per-example input form (`verify.core.inputs`) costs the scale case
(recsys_scale, batch 256: a user id, an item history, categories and dense features).

Prints, measured in this run:
- per step, on the case's own batches: the CPU seconds the canonical form takes against the
  whole-batch digest it replaced (one sha256 of each feature cast to float32/int64);
- capture overhead: seconds of the same captured run (`--side`, default tf1) with the
  canonical form over the same run with the old digest patched in its place, rounds in
  alternating order, as a ratio per round (target <= 1.02x: not measurable).

    python benchmarks/input_capture.py [--full] [--steps N] [--repeats 3] [--side tf1]
"""
import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from targets import target_line  # noqa: E402


def whole_batch_digests(batch):
    """The form `input` had before: one digest of each feature's whole batch (sparse: its
    batch size, rows and ids), as strings."""
    from verify.core.trace import digest

    out = {}
    for name, value in batch.items():
        if hasattr(value, "indices") and hasattr(value, "values"):
            rows = np.asarray(value.indices, np.int64).reshape(-1, 2)[:, 0]
            ids = np.asarray(value.values, np.int64).ravel()
            size = np.asarray(value.dense_shape, np.int64).ravel()[:1]
            out[name] = digest(np.concatenate([size, rows, ids]))
        else:
            array = np.asarray(value)
            out[name] = digest(array.astype(np.float32 if array.dtype.kind == "f" else np.int64))
    return out


def per_step_seconds(case, form, repeats: int = 20) -> float:
    """Median CPU seconds `form` takes over one step's global batch of the case."""
    from verify.oracle_math import batch_at

    batches = [batch_at(case.examples, step, case.batch_size)
               for step in range(1, case.steps + 1)]
    batches = [{**features, "label": labels} for features, labels in batches]
    times = []
    for _ in range(repeats):   # CPU seconds: on a loaded machine, wall time is mostly waiting
        started = time.process_time()
        for batch in batches:
            form(batch)
        times.append((time.process_time() - started) / len(batches))
    return statistics.median(times)


def capture_seconds(case, impl, old_form: bool) -> float:
    import verify.core.trace as trace_module
    from verify.runners.run import run_implementation

    canonical = trace_module.input_batch
    if old_form:
        trace_module.input_batch = whole_batch_digests
    try:
        trace = run_implementation(case, impl, capture_steps=True)
    finally:
        trace_module.input_batch = canonical
    if trace.error:
        raise SystemExit(f"{impl.name} failed: {trace.error}")
    kept = type(trace.get(1, "input", "label")).__name__
    assert kept == ("str" if old_form else "InputFeature"), kept
    return trace.meta.seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true", help="the 1M-row user table")
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--side", default="tf1")
    args = parser.parse_args()
    from cases.recsys_scale import make_case
    from verify.core.inputs import input_batch

    case = make_case(full=args.full, steps=args.steps)
    print(f"recsys_scale: {case.description}")
    new, old = per_step_seconds(case, input_batch), per_step_seconds(case, whole_batch_digests)
    print(f"per step: canonical form {new * 1e3:.3f} ms, whole-batch digest {old * 1e3:.3f} ms "
          f"({new / old:.2f}x)")
    from verify.runners.capture.devices import configure_cpu_replicas

    configure_cpu_replicas()
    impl = case.implementation(args.side)
    capture_seconds(case, impl, old_form=False)            # warm-up: imports, graph caches
    ratios = []
    for round_ in range(args.repeats):
        order = (False, True) if round_ % 2 == 0 else (True, False)
        seconds = {old_form: capture_seconds(case, impl, old_form) for old_form in order}
        ratios.append(seconds[False] / seconds[True])
        print(f"round {round_ + 1}: canonical {seconds[False]:.2f} s, whole-batch digest "
              f"{seconds[True]:.2f} s ({ratios[-1]:.3f}x)")
    print(target_line(f"{args.side} capture with canonical inputs / with the old digest",
                      ratios, 1.02, "x", at_most=True))


if __name__ == "__main__":
    main()
