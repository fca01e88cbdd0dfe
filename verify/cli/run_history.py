"""`history list` and `history compare`: the run records a history directory holds, and the
regressions of one run since another."""
from __future__ import annotations

from pathlib import Path

from verify.cli.arguments import InputError, factor_argument
from verify.store.history import compare_runs, history, load_record
from verify.render.terminal import comparison_terminal_lines


def add_history_parser(commands) -> None:
    hist = commands.add_parser("history", help="list or compare run records")
    hist_commands = hist.add_subparsers(required=True, metavar="ACTION")
    listing = hist_commands.add_parser("list", help="one line per recorded run")
    listing.add_argument("history_dir")
    listing.set_defaults(run=history_list_command)
    versus = hist_commands.add_parser("compare", help="regressions of a run since another")
    versus.add_argument("current", help="a run record, report directory or history directory "
                                        "(its latest run)")
    versus.add_argument("previous", nargs="?", help="the run to compare with (default: the run "
                                                    "before `current` in its history directory)")
    factor_argument(versus)
    versus.set_defaults(run=history_compare_command)


def history_list_command(args) -> int:
    records = history(Path(args.history_dir))
    if not records:
        raise InputError(f"{args.history_dir} holds no run records (history/<run>.json)")
    print(f"{'run':<24} {'time':<26} {'commit':<12} {'verdict':<8} {'pairs':>5}  "
          f"worst max abs (loss / grad / weight)")
    for r in records:
        worst = {w["quantity"]: w["max_abs"] for w in r.get("worst", [])}
        drift = " / ".join(f"{worst[q]:.2g}" if q in worst else "-"
                           for q in ("loss", "grad", "weight"))
        commit = (r.get("provenance", {}).get("git_commit") or "-")[:10]
        print(f"{r['run_id']:<24} {r.get('timestamp', '?'):<26} {commit:<12} "
              f"{r['verdict']:<8} {len(r.get('pairs', [])):>5}  {drift}")
    return 0


def history_compare_command(args) -> int:
    current_path = Path(args.current)
    if args.previous:
        current, previous = load_record(current_path), load_record(args.previous)
    elif current_path.is_dir() and not (current_path / "run.json").is_file():
        records = history(current_path)
        if len(records) < 2:
            raise InputError(f"{current_path} holds {len(records)} run record(s); comparing "
                             f"needs two (or pass PREVIOUS)")
        current, previous = records[-1], records[-2]
    else:
        current = load_record(current_path)
        folder = current_path.parent if current_path.is_file() else current_path / "history"
        earlier = [r for r in history(folder) if r.get("timestamp", "") < current["timestamp"]
                   and r.get("run_id") != current.get("run_id")] if folder.is_dir() else []
        if not earlier:
            raise InputError(f"no run before {current['run_id']} in {folder}; pass PREVIOUS")
        previous = earlier[-1]
    if current is None or previous is None:
        raise InputError("no run record found to compare")
    comparison = compare_runs(current, previous, args.regression_factor)
    print(f"run {current.get('run_id')} ({current.get('verdict')})")
    for line in comparison_terminal_lines(comparison):
        print(line)
    return 0 if comparison.ok else 1
