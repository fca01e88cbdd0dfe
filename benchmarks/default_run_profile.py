"""Where a parity run spends its time, from its progress lines: per case and per kind of run.

    pytest verify/ -n 2 | tee run.log
    python benchmarks/default_run_profile.py run.log [more.log ...] [--report reports/]

Each finished pair prints `parity N [elapsed] VERDICT case: ref -> cand (S s; ran a 1.2s, ...;
waited for b 3.0s)`: the pair's own seconds (its runs, judging and layer replay), the
implementations it ran (each at most once per session) and those it waited for while another
worker ran them. The table sums, per case, the runs by kind (a
reference: the pair's reference side; a faithful candidate; a control; a sensitivity mutant;
a destination environment's side, named by a `-tf221`/`keras3` suffix or environment), the
waits for another worker's runs (a worker idle meanwhile), the pairs' judging (their seconds
minus their runs and waits: comparison, preflight, layer replays, and an environment's worker
process starting), and
the share of the run's summed work. The wall time is the last line's elapsed; the summed work
is over both workers, so it is about twice the wall time of a `-n 2` run. With `--report`,
the layer replays' own seconds (summary.csv's `layer_replay`) are split out of the judging.
It also prints the training runs' summed seconds (with `--report`, the layer replays' too)
over the machine's cores: the least wall time the runs alone take at the speed they ran,
whatever judging, waiting and start-up cost.
The table is of the first log; the last line judges every log's wall time against the
target (<= 240 s, four minutes, on a 2-core machine).

When a log ends with the shell's `time` figures (`time pytest verify/ -n 2 2>&1 | tee run.log`
in bash), it also prints the run's CPU (user + system) and the least wall time that CPU allows
on this machine's cores (CPU / cores: every core busy the whole run): a wall-time target below
it cannot be met without that much less work.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from targets import target_line  # noqa: E402

TARGET_WALL = 240.0

LINE = re.compile(r"^parity +\d+ \[ *([\d.]+)s\] (\S+) +([^:]+): (\S+) -> (\S+) "
                  r"\(([\d.]+)s(?:; ran (.*?))?(?:; waited for (.*))?\)$")
RAN = re.compile(r"(\S+) ([\d.]+)s")
TIME = re.compile(r"^(real|user|sys)\s+(\d+)m([\d.]+)s$")   # bash's `time`


def shell_time(log: Path) -> dict[str, float]:
    """The `real`, `user` and `sys` seconds bash's `time` printed in `log` ({} if none)."""
    found = {}
    for line in log.read_text(errors="replace").splitlines():
        match = TIME.match(line.strip())
        if match:
            found[match.group(1)] = 60 * int(match.group(2)) + float(match.group(3))
    return found


def kind_of(name: str, reference: str) -> str:
    if name == reference:
        return "reference"
    if "~" in name:
        return "mutant"
    if "tf221" in name or "keras3" in name:
        return "destination env"
    if name.startswith("control-"):
        return "control"
    return "faithful"


def profile(log: Path) -> tuple[dict, float]:
    per_case: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    wall = 0.0
    for line in log.read_text(errors="replace").splitlines():
        found = LINE.match(line.strip())
        if not found:
            continue
        elapsed, _, case, reference, _, seconds, ran, waited = found.groups()
        wall = max(wall, float(elapsed))
        runs = 0.0
        for name, took in RAN.findall(ran or ""):
            per_case[case][kind_of(name, reference)] += float(took)
            runs += float(took)
        waits = sum(float(took) for _, took in RAN.findall(waited or ""))
        per_case[case]["waits"] += waits
        per_case[case]["judging"] += max(float(seconds) - runs - waits, 0.0)
        per_case[case]["pairs"] += 1
    return per_case, wall


def replay_seconds(report: Path) -> dict[str, float]:
    import pandas as pd

    pairs = pd.read_csv(report / "summary.csv", keep_default_na=False)
    out: dict[str, float] = defaultdict(float)
    for case, note in zip(pairs["case"], pairs.get("layer_replay", [])):
        found = re.search(r"\(([\d.]+) s in all\)", str(note))
        if found:
            out[case] += float(found.group(1))
    return out


def runs_floor_line(per_case: dict, replays: dict[str, float], kinds: list[str],
                    cores: int) -> str:
    """The training runs' own seconds (every kind of run, and the layer replays, which train
    again) and the least wall time they take on `cores` cores at the speed they ran in this log
    even if judging, waiting and start-up cost nothing: a target below it needs cheaper or
    fewer runs, not less overhead."""
    runs = sum(seconds.get(k, 0.0) for seconds in per_case.values() for k in kinds)
    runs += sum(replays.values())
    side = "below" if runs / cores <= TARGET_WALL else "above"
    return (f"training runs (every kind{', and the layer replays' if replays else ''}): "
            f"{runs:.0f} s of the workers' time; at that speed at least {runs / cores:.0f} s of "
            f"wall time on {cores} cores with nothing else to do ({side} the "
            f"{TARGET_WALL:.0f} s target)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log", type=Path, nargs="+")
    parser.add_argument("--report", type=Path, default=None)
    args = parser.parse_args()
    per_case, wall = profile(args.log[0])
    replays = replay_seconds(args.report) if args.report else {}
    kinds = ["reference", "faithful", "control", "mutant", "destination env"]
    total = sum(v for c in per_case.values() for k, v in c.items() if k != "pairs")
    print(f"wall {wall:.0f} s; summed work {total:.0f} s over {sum(c['pairs'] for c in per_case.values()):.0f} pairs")
    print("| case | pairs | " + " | ".join(f"{k} runs" for k in kinds)
          + " | waits for another worker | judging | of which layer replays"
          + " | share of the work |")
    print("|---|" + "---|" * (len(kinds) + 5))
    for case, seconds in sorted(per_case.items(), key=lambda item: -sum(
            v for k, v in item[1].items() if k != "pairs")):
        work = sum(v for k, v in seconds.items() if k != "pairs")
        print(f"| {case} | {seconds['pairs']:.0f} | "
              + " | ".join(f"{seconds.get(k, 0.0):.0f} s" for k in kinds)
              + f" | {seconds['waits']:.0f} s | {seconds['judging']:.0f} s"
              + f" | {replays.get(case, 0.0):.0f} s"
              + f" | {100 * work / total:.0f}% |")
    cores = os.cpu_count() or 1
    print(runs_floor_line(per_case, replays, kinds, cores))
    for log in args.log:
        figures = shell_time(log)
        if {"real", "user", "sys"} <= set(figures):
            cpu = figures["user"] + figures["sys"]
            print(f"{log.name}: wall {figures['real']:.0f} s, CPU {cpu:.0f} s (user + system): "
                  f"{cpu / figures['real']:.2f} of {cores} cores busy on average; at least "
                  f"{cpu / cores:.0f} s of wall time with every core busy the whole run "
                  f"({'below' if cpu / cores <= TARGET_WALL else 'above'} the "
                  f"{TARGET_WALL:.0f} s target)")
    walls = [profile(log)[1] for log in args.log]
    print(target_line("default run wall time", walls, TARGET_WALL, " s", at_most=True))


if __name__ == "__main__":
    main()
