"""Multi-worker runs with workers forked from a process that imported TensorFlow once / with
fresh worker processes: wall time and the machine's CPU, per run of the default run's
multi-worker implementations.

A fresh worker process spends about 4.3 s of CPU importing TensorFlow before it joins its
cluster; the fork server (`verify.runners.fork_server`) imports it once per process and forks
each worker from there. The workers' CPU is not this process's (the forked ones are the
server's children), so CPU is the machine's busy time (`/proc/stat`) over each run: run it on
an otherwise idle machine. A first forked run, not timed, starts the server (its import is
paid once per process that starts workers). Rounds alternate the two kinds, their order
turning each round (`baselines.rotated`).

    python benchmarks/worker_start.py [--implementations multi-worker-2x1,multi-worker-2x2]
                                      [--rounds 3]

Targets (stated before measuring): forked / fresh CPU <= 0.7x and wall <= 0.9x, the median
of the rounds.
"""
import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from baselines import alternating_rounds  # noqa: E402
from targets import target_line  # noqa: E402

KINDS = ["fresh", "forked"]


def busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy since boot (`/proc/stat`)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def timed_runs(case, names: list[str], kind: str) -> tuple[float, float]:
    """Wall and machine CPU seconds of running `names` once each, as `kind`."""
    import tempfile

    from verify.runners.fork_server import SWITCH
    from verify.runners.run import run_implementation

    os.environ[SWITCH] = "1" if kind == "forked" else "0"
    wall, cpu = time.perf_counter(), busy_seconds()
    for name in names:
        trace = run_implementation(case, case.implementation(name), workdir=Path(
            tempfile.mkdtemp(prefix="worker-start-")))
        if trace.error:
            raise SystemExit(f"{name} failed ({kind}): {trace.error.splitlines()[0]}")
        started = trace.meta.details.get("worker_processes", "")
        if (kind == "forked") != started.startswith("forked"):
            raise SystemExit(f"{name} ({kind}): its workers were {started}")
    return time.perf_counter() - wall, busy_seconds() - cpu


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--implementations", default="multi-worker-2x1,multi-worker-2x2")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    from verify.core.case import SuiteOptions
    from verify.runners.capture.devices import configure_cpu_replicas
    from verify.runners.case_sources import load_cases, resolve_sources

    configure_cpu_replicas()
    case = load_cases(resolve_sources([str(ROOT / "cases")]), SuiteOptions(),
                      ["custom_loop"])["custom_loop"]
    names = args.implementations.split(",")
    print(f"custom_loop {', '.join(names)}; {os.cpu_count()} CPUs; {args.rounds} rounds")
    timed_runs(case, names[:1], "forked")   # starts the fork server: once per process
    walls, cpus = alternating_rounds(KINDS, args.rounds, lambda kind: timed_runs(
        case, names, kind), cpu_label="machine CPU")
    print(target_line("forked / fresh machine CPU",
                      [f / s for f, s in zip(cpus["forked"], cpus["fresh"])], 0.7, "x",
                      at_most=True))
    print(target_line("forked / fresh wall",
                      [f / s for f, s in zip(walls["forked"], walls["fresh"])], 0.9, "x",
                      at_most=True))


if __name__ == "__main__":
    main()
