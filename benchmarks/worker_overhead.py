"""Out-of-process overhead: a run asked of an environment process / the same run
in-process.

The environment process runs in an environment that inherits the suite's own packages (same
TensorFlow), so the ratio is the cost of the process hop alone: the request, the trace saved by
that process and read back. Target after warm-up: <= 1.1x. The first run in a new environment
process also pays its start (Python + TensorFlow import): printed separately, as a ratio too.

    python benchmarks/worker_overhead.py [--case tpu_embedding] [--implementation tf2]
                                         [--repeats 5] [--steps N]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from verify.runners.case_sources import load_cases, resolve_sources  # noqa: E402
from verify.core.case import SuiteOptions  # noqa: E402
from verify.runners.capture.devices import configure_cpu_replicas  # noqa: E402
from verify.environments.declared import DeclaredEnvironment  # noqa: E402
from verify.core.runner import RunSpec  # noqa: E402
from verify.runners.run import run_implementation  # noqa: E402
from verify.environments.pool import EnvironmentPool  # noqa: E402


def wall(fn) -> tuple[float, object]:
    started = time.perf_counter()
    result = fn()
    return time.perf_counter() - started, result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="tpu_embedding")
    parser.add_argument("--implementation", default="tf2")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=None)
    args = parser.parse_args()
    configure_cpu_replicas()
    sources = (str(ROOT / "cases"),)
    case = load_cases(resolve_sources(list(sources)), SuiteOptions(), [args.case])[args.case]
    implementation = case.implementation(args.implementation)
    spec = RunSpec(sources=sources, case=args.case, implementation=args.implementation,
                   steps=args.steps)

    def in_process():
        trace = run_implementation(case, implementation, steps=args.steps)
        if trace.error:
            raise SystemExit(f"in-process run failed: {trace.error}")
        return trace

    with tempfile.TemporaryDirectory(prefix="parity-bench-envs-") as cache:
        same = DeclaredEnvironment("bench-same-packages", inherit=True)
        pool = EnvironmentPool({same.name: same}, sources, cache=Path(cache),
                               progress=lambda line: None)

        def in_environment_process():
            trace = pool.run(spec, same.name, timeout=600)
            if trace.error:
                raise SystemExit(f"environment process run failed: {trace.error}")
            return trace

        try:
            in_process()                                   # warm-up: traces its functions
            cold, _ = wall(in_environment_process)         # builds the env, starts its process
            local, remote = [], []
            for _ in range(args.repeats):                  # interleaved: the same load on both
                local.append(wall(in_process))
                remote.append(wall(in_environment_process))
        finally:
            pool.close()
    base = statistics.median(seconds for seconds, _ in local)
    ratio = statistics.median(seconds for seconds, _ in remote) / base
    # Each call's wall time over the training time the run itself measured (trace seconds):
    # the load on the machine scales both, so their quotient is the hop's cost alone.
    hop = (statistics.median(seconds / trace.meta.seconds for seconds, trace in remote)
           / statistics.median(seconds / trace.meta.seconds for seconds, trace in local))
    print(f"{args.case}/{args.implementation}, {args.steps or case.steps} steps, median of "
          f"{args.repeats} interleaved runs each (wall time, the trace handed back included)")
    print(f"  environment process after warm-up / in-process, wall time: {ratio:.3f}x")
    print(f"  environment process after warm-up / in-process, per run (wall / the run's own "
          f"training time): {hop:.3f}x ({'ok' if hop <= 1.1 else 'above'} the 1.1x target)")
    print(f"  first run in a new environment process (environment built, process started, "
          f"TensorFlow imported) / in-process: {cold / base:.1f}x")


if __name__ == "__main__":
    main()
