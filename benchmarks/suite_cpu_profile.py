"""Where the test command's CPU goes: per area (the parity pairs of each case, each folder of
tests/), per test file and per test, and how much no test accounts for.

    python benchmarks/suite_cpu_profile.py --run [--out DIR] [-- PYTEST ARGS]
    python benchmarks/suite_cpu_profile.py DIR

`--run` runs the README's test command (`pytest -n 3`, or the pytest arguments after `--`) with
`benchmarks/cpu_per_test.py` logging every test's CPU into DIR, and measures the whole run's
wall time and CPU (its own and every process it waited for). Without `--run` it summarises the
logs a run left in DIR. On a machine of N cores no schedule brings the command under CPU / N of
wall time: the last lines judge the wall time and that floor against the 12-minute target.
A test's CPU is its process's and that of the children it waited for; "not in any test" is the
rest of the run's CPU: the workers' start-up and collection, the session's report, the
destination environments' worker processes and the comparison kernels' warm-up.

The plugin also logs every training run (`run_implementation`); the last table lists the runs
made more than once with the same case, implementation, steps, capture, data and runner, the
CPU of the repeats and the tests that made them: the repeated work a shared trace could save,
or a test that repeats a run on purpose (a capture on/off pair, a noise floor's runs). Runs
in child processes are not in it (`cpu_per_test`).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from targets import target_line  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TARGET_WALL = 720.0
TEST_COMMAND = ["-n", "3"]
RUNS_SUFFIX = ".runs.tsv"


def read_logs(directory: Path) -> list[tuple[str, float, float, float]]:
    """Every logged test: (nodeid, wall, own CPU, children's CPU)."""
    rows = []
    for log in sorted(directory.glob("*.tsv")):
        if log.name.endswith(RUNS_SUFFIX):
            continue
        for line in log.read_text().splitlines():
            nodeid, wall, own, children = line.split("\t")
            rows.append((nodeid, float(wall), float(own), float(children)))
    return rows


def read_runs(directory: Path) -> list[tuple[str, float, float, str]]:
    """Every logged training run: (test, wall, CPU, identity)."""
    runs = []
    for log in sorted(directory.glob("*" + RUNS_SUFFIX)):
        for line in log.read_text().splitlines():
            test, wall, cpu, identity = line.split("\t", 3)
            runs.append((test, float(wall), float(cpu), identity))
    return runs


def repeated_runs(runs) -> list[tuple[str, int, float, list[str]]]:
    """(identity, times run, CPU of the runs after the first, the tests that ran it) for every
    run made more than once, most repeated CPU first.

    >>> runs = [("t1", 2.0, 2.0, "a"), ("t2", 2.0, 3.0, "a"), ("t2", 1.0, 1.0, "b")]
    >>> repeated_runs(runs)
    [('a', 2, 3.0, ['t1', 't2'])]
    """
    groups: dict[str, list] = defaultdict(list)
    for test, _, cpu, identity in runs:
        groups[identity].append((test, cpu))
    repeats = [(identity, len(made), sum(cpu for _, cpu in made[1:]),
                sorted({test for test, _ in made})) for identity, made in groups.items()
               if len(made) > 1]
    return sorted(repeats, key=lambda r: -r[2])


def runs_report(runs, total_cpu: float, limit: int = 15) -> list[str]:
    """The runs' totals and the table of repeated runs."""
    repeats = repeated_runs(runs)
    spent = sum(cpu for _, _, cpu, _ in runs)
    again = sum(r[2] for r in repeats)
    lines = [f"{len(runs)} training runs, {spent:.0f} s of CPU in them; "
             f"{len({r[3] for r in runs})} distinct; {sum(r[1] - 1 for r in repeats)} repeats "
             f"of {len(repeats)} runs, {again:.0f} s of CPU ({100 * again / total_cpu:.0f}% of "
             f"the CPU)", "",
             "| run (case, implementation, steps, capture, device, replicas) | data | key | "
             "times | CPU of the repeats s | tests |", "|---|---|---|---|---|---|"]
    for identity, times, cpu, tests in repeats[:limit]:
        fields = json.loads(identity)
        shown = ", ".join(str(f) for f in fields[:6])
        # rows alike in the shown fields differ in the data, runner or options: the key says so
        key = hashlib.sha1(identity.encode()).hexdigest()[:8]
        lines.append(f"| {shown} | {str(fields[6])[:8]} | {key} | {times} | {cpu:.1f} | "
                     f"{'; '.join(t.split('::', 1)[-1] for t in tests[:3])}"
                     f"{' ...' if len(tests) > 3 else ''} |")
    return lines


def area_of(nodeid: str) -> str:
    """`parity pairs: <case>` for a pair of the parity suite, else the test's folder.

    >>> area_of("verify/test_parity.py::test_pair[custom_loop:reference-x1-vs-mirrored-x1]")
    'parity pairs: custom_loop'
    >>> area_of("tests/e2e/test_pr_action.py::test_steps")
    'tests/e2e'
    """
    path = nodeid.split("::")[0]
    if path.endswith("test_parity.py") and "[" in nodeid:
        return "parity pairs: " + nodeid.split("[", 1)[1].split(":")[0]
    return str(Path(path).parent)


def summed(rows, key) -> list[tuple[str, int, float, float, float]]:
    """(group, tests, wall, own CPU, children's CPU) per `key(nodeid)`, most CPU first."""
    groups: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0, 0.0])
    for nodeid, wall, own, children in rows:
        group = groups[key(nodeid)]
        group[0] += 1
        group[1] += wall
        group[2] += own
        group[3] += children
    return sorted(((name, int(g[0]), g[1], g[2], g[3]) for name, g in groups.items()),
                  key=lambda item: -(item[3] + item[4]))


def table(title: str, groups, total_cpu: float, limit: int) -> list[str]:
    lines = [f"| {title} | tests | CPU s | of which in child processes | wall s | share of "
             "the CPU |", "|---|---|---|---|---|---|"]
    for name, count, wall, own, children in groups[:limit]:
        lines.append(f"| {name} | {count} | {own + children:.0f} | {children:.0f} | {wall:.0f} |"
                     f" {100 * (own + children) / total_cpu:.0f}% |")
    return lines


def run_test_command(out: Path, pytest_args: list[str]) -> tuple[float, float]:
    """Run pytest with the per-test log; return its wall time and CPU (every process waited
    for, the pytest process included)."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.tsv"):
        old.unlink()
    env = {**os.environ, "PARITY_CPU_LOG": str(out),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parent),
                                                       os.environ.get("PYTHONPATH")]))}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    status = subprocess.call([sys.executable, "-m", "pytest", "-p", "cpu_per_test",
                              *pytest_args], cwd=ROOT, env=env)
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if status not in (0, 1):
        sys.exit(f"pytest exited with status {status}: no profile")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return wall, cpu


def report(rows, wall: float | None, cpu: float | None, limit: int = 15) -> list[str]:
    counted = sum(own + children for _, _, own, children in rows)
    total = cpu if cpu else counted
    lines = [f"{len(rows)} tests; CPU in tests {counted:.0f} s"
             + (f" of the run's {cpu:.0f} s; not in any test {cpu - counted:.0f} s "
                f"({100 * (cpu - counted) / cpu:.0f}%)" if cpu else ""), ""]
    lines += table("area", summed(rows, area_of), total, limit) + [""]
    lines += table("test file", summed(rows, lambda n: n.split("::")[0]), total, limit) + [""]
    lines += table("test", summed(rows, lambda n: n), total, limit)
    if wall is not None and cpu is not None:
        cores = os.cpu_count() or 1
        lines += ["", f"wall {wall:.0f} s, CPU {cpu:.0f} s: {cpu / wall:.2f} of {cores} cores "
                      f"busy on average",
                  target_line("test command wall time", [wall], TARGET_WALL, " s",
                              at_most=True),
                  target_line(f"CPU / {cores} cores (the least wall time this work allows)",
                              [cpu / cores], TARGET_WALL, " s", at_most=True)]
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", type=Path, nargs="?", help="a directory of per-test logs")
    parser.add_argument("--run", action="store_true", help="run the test command first")
    parser.add_argument("--out", type=Path, default=None, help="where --run logs (a new "
                        "temporary directory by default)")
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER,
                        help="after --: pytest's arguments (default: -n 3)")
    args = parser.parse_args()
    pytest_args = [a for a in args.pytest_args if a != "--"] or TEST_COMMAND
    wall = cpu = None
    if args.run:
        directory = args.out or Path(tempfile.mkdtemp(prefix="suite-cpu-"))
        wall, cpu = run_test_command(directory, pytest_args)
        print(f"per-test logs: {directory}")
    elif args.logs is None:
        parser.error("give a directory of logs, or --run")
    else:
        directory = args.logs
    rows = read_logs(directory)
    if not rows:
        sys.exit(f"{directory}: no per-test logs (*.tsv) there")
    print("\n".join(report(rows, wall, cpu)))
    runs = read_runs(directory)
    if runs:
        print("\n" + "\n".join(runs_report(runs, cpu or sum(r[2] + r[3] for r in rows))))


if __name__ == "__main__":
    main()
