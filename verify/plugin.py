"""pytest plugin: `pytest verify/` runs every case's pairs and writes the report.

Options: --tpu/--tpu-name, --steps, --report-dir, --replicas, --full, --data-dir, --case,
--keep-traces, --history-dir, --compare-to, --regression-factor.
Each test compares one (reference, candidate) pair of one case. Traces are run once per
process and cached; each finished test persists its drift rows, loss curves and pair record
at once under `<report-dir>/parts/<run id>/`, and prints a progress line. The controlling
process (the xdist controller under `-n`) merges every part when the session ends into
drift.csv, summary.csv, losses.csv, summary.md, report.html and run.json, adds the run record
to the history directory and, with --compare-to, reports regressions since an earlier run.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from verify.case import Case, SuiteOptions
from verify.compare import compare_traces
from verify.history import (DEFAULT_FACTOR, RunComparison, compare_runs, git_commit,
                            load_record, run_record, write_record)
from verify.kept_traces import TRACES_DIR, keep_case, keep_trace
from verify.report import (PairResult, RunResults, add_preflight, compare_pair, read_parts, terminal_lines,
                           trace_environment, write_part, write_report)
from verify.trace import Trace
from verify.verdict import FAIL, Verdict

OPTIONS_KEY = pytest.StashKey[SuiteOptions]()
SESSION_KEY = pytest.StashKey["ParitySession"]()
PROGRESS_PROPERTY = "parity"
PAIR_TEST = "::test_pair["    # the parity test of verify/test_parity.py, as its node ids read


def pytest_addoption(parser):
    group = parser.getgroup("parity", "numerical parity of TensorFlow migrations")
    group.addoption("--tpu", action="store_true",
                    help="run the implementations on a real TPU (TPUClusterResolver); fails, "
                         "saying why, when no TPU is reachable")
    group.addoption("--tpu-name", default="", help="TPU name or grpc address ('' = local TPU VM)")
    group.addoption("--steps", type=int, default=None,
                    help="training steps per run (default: each case's own)")
    group.addoption("--report-dir", default="reports", help="where the report is written")
    group.addoption("--replicas", default="1,2,4,8",
                    help="comma-separated replica counts of candidates to run (default 1,2,4,8)")
    group.addoption("--full", action="store_true",
                    help="the long tier: cases run their full-length training")
    group.addoption("--data-dir", default=None, help="directory with real datasets for cases")
    group.addoption("--case", action="append", default=None, dest="parity_cases",
                    help="run only this case (repeatable)")
    group.addoption("--keep-traces", action="store_true",
                    help="save every run's trace (npz + json) and the case's tolerances under "
                         "<report-dir>/traces/, for `python -m verify compare/report`")
    group.addoption("--history-dir", default=None,
                    help="where every run adds its run record (default <report-dir>/history; "
                         "'none' to keep no history)")
    group.addoption("--compare-to", default=None,
                    help="a previous run record, report directory or history directory (its "
                         "latest run): report regressions since that run")
    group.addoption("--regression-factor", type=float, default=DEFAULT_FACTOR,
                    help=f"with --compare-to: a worst drift grown more than this many times is a "
                         f"regression (default {DEFAULT_FACTOR:g})")


def _options(config) -> SuiteOptions:
    steps = config.getoption("steps")
    if steps is not None and steps <= 0:
        raise pytest.UsageError(f"--steps must be a positive number of steps, got {steps}")
    raw = config.getoption("replicas")
    try:
        replicas = tuple(sorted({int(r) for r in raw.split(",") if r.strip()}))
    except ValueError:
        raise pytest.UsageError(f"--replicas takes comma-separated whole numbers like 1,2,4,8; "
                                f"got {raw!r}") from None
    if not replicas or min(replicas) < 1:
        raise pytest.UsageError(f"--replicas needs counts >= 1, got {raw!r}")
    data_dir = config.getoption("data_dir")
    if data_dir is not None and not Path(data_dir).is_dir():
        raise pytest.UsageError(f"--data-dir {data_dir} is not a directory")
    return SuiteOptions(steps=steps, device="tpu" if config.getoption("tpu") else "cpu",
                        tpu_name=config.getoption("tpu_name"), replicas=replicas,
                        full=config.getoption("full"),
                        data_dir=Path(data_dir) if data_dir else None)


def _is_worker(config) -> bool:
    return hasattr(config, "workerinput")


def _path_option(config, name: str) -> Path | None:
    """A path option, relative to the rootdir like --report-dir."""
    value = config.getoption(name)
    if value is None:
        return None
    path = Path(value)
    return path if path.is_absolute() else Path(config.rootpath) / path


def _history_dir(config, report_dir: Path) -> Path | None:
    value = config.getoption("history_dir")
    if value is None:
        return report_dir / "history"
    return None if value.strip().lower() in ("none", "") else _path_option(config, "history_dir")


def pytest_configure(config):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    options = _options(config)
    config.stash[OPTIONS_KEY] = options
    if options.device == "tpu" and (config.getoption("numprocesses", None) or 0) > 1:
        raise pytest.UsageError("--tpu runs in one process (a TPU belongs to one process at a "
                                "time); drop -n/--numprocesses")
    run_id = (config.workerinput["parity_run_id"] if _is_worker(config)
              else time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}")
    report_dir = _path_option(config, "report_dir")
    parity = ParitySession(options, report_dir, run_id, config.getoption("parity_cases"),
                           keep_traces=config.getoption("keep_traces"),
                           history_dir=_history_dir(config, report_dir),
                           root=Path(config.rootpath))
    config.stash[SESSION_KEY] = parity
    if _is_worker(config):
        return
    factor = config.getoption("regression_factor")
    if not factor > 1:
        raise pytest.UsageError(f"--regression-factor must be > 1 (e.g. 10), got {factor}")
    compare_to = _path_option(config, "compare_to")
    if compare_to is not None:
        try:
            parity.previous = load_record(compare_to)
        except (FileNotFoundError, ValueError) as e:
            raise pytest.UsageError(f"--compare-to: {e}") from None
        parity.factor, parity.compare_to = factor, compare_to
    if parity.keep_traces:
        shutil.rmtree(parity.traces_dir, ignore_errors=True)   # the report dir holds one run
    config.pluginmanager.register(ProgressReporter(config, parity), "parity-progress")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist: every worker writes its parts under the controller's run id."""
    node.workerinput["parity_run_id"] = node.config.stash[SESSION_KEY].run_id


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Attach the pair's progress facts to its test report (xdist carries them to the
    controller)."""
    try:
        return (yield)
    finally:
        pair = item.callspec.params.get("pair") if hasattr(item, "callspec") else None
        if isinstance(pair, Pair):
            info = item.config.stash[SESSION_KEY].progress.pop(pair.id, None)
            if info is not None:
                item.user_properties.append((PROGRESS_PROPERTY, info))


class ProgressReporter:
    """A terminal line per finished pair, with the elapsed time; and the pairs that crashed.

    Registered in the controlling process only: under xdist it hears of every worker's test
    through `pytest_runtest_logreport`, and of a dead worker's test as a crash report.
    """

    def __init__(self, config, parity: "ParitySession"):
        self.config, self.parity = config, parity
        self.started = time.monotonic()
        self.done = 0

    def pytest_runtest_logreport(self, report):
        if (report.failed and report.when not in ("setup", "call", "teardown")
                and PAIR_TEST in report.nodeid):
            why = " ".join(str(report.longrepr).split())
            self.parity.lost[report.nodeid] = why
            self._write(f"parity LOST {report.nodeid}: {why}")
            return
        info = dict(report.user_properties).get(PROGRESS_PROPERTY)
        if report.when != "call" or info is None:
            return
        self.done += 1
        ran = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in info["ran"])
        self._write(f"parity {self.done:>3} [{time.monotonic() - self.started:7.1f}s] "
                    f"{info['verdict']:<6} {info['pair']} ({info['seconds']:.1f}s"
                    + (f"; ran {ran}" if ran else "") + ")")

    def _write(self, line: str) -> None:
        writer = self.config.pluginmanager.get_plugin("terminalreporter")
        if writer is None or self.config.get_verbosity() < -1:
            return
        if getattr(getattr(writer, "_tw", None), "width_of_current_line", 0):
            writer.write("\n")   # after the progress dots of -q and xdist
        writer.write_line(line)


def pytest_sessionfinish(session, exitstatus):
    if _is_worker(session.config):
        return
    parity = session.config.stash[SESSION_KEY]
    parity.written = parity.write_report()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _is_worker(config):
        return
    parity = config.stash[SESSION_KEY]
    if parity.written:
        terminalreporter.section("parity report")
        for line in terminal_lines(parity.results, parity.written, parity.comparison):
            terminalreporter.write_line(line)
    for note in parity.notes:
        terminalreporter.write_line(note)


@pytest.fixture(scope="session")
def parity(request) -> "ParitySession":
    """The session's parity harness: cached traces, comparison, persisted results."""
    return request.config.stash[SESSION_KEY]


@dataclasses.dataclass(frozen=True)
class Pair:
    case: str
    reference: str
    candidate: str

    @property
    def id(self) -> str:
        return f"{self.case}:{self.reference}-vs-{self.candidate}"


class ParitySession:
    """Runs implementations (each at most once per process), compares pairs, keeps results."""

    def __init__(self, options: SuiteOptions, report_dir: Path, run_id: str,
                 case_names: list[str] | None, *, keep_traces: bool = False,
                 history_dir: Path | None = None, root: Path | None = None):
        self.options, self.report_dir, self.run_id = options, report_dir, run_id
        self.case_names = case_names
        self.parts_dir = report_dir / "parts" / run_id
        self.traces_dir = report_dir / TRACES_DIR
        self.keep_traces, self.history_dir, self.root = keep_traces, history_dir, root
        self.previous: dict | None = None      # --compare-to's run record
        self.compare_to: Path | None = None
        self.factor = DEFAULT_FACTOR
        self._cases: dict[str, Case] | None = None
        self._traces: dict[tuple[str, str], Trace] = {}
        self._configs: dict[tuple[str, str], dict] = {}
        self._against_oracle: dict[tuple[str, str], Any] = {}
        self._ran: list[tuple[str, float]] = []   # (implementation, seconds) run by a check
        self._kept_cases: set[str] = set()
        self._tpu_error: str | None = None
        self.progress: dict[str, dict] = {}     # pair id -> what its test did, for the report
        self.lost: dict[str, str] = {}          # test id -> why it left no result
        self.notes: list[str] = []
        self.written: list[Path] = []
        self.results: RunResults | None = None
        self.comparison: RunComparison | None = None

    # ---- collection ----
    def cases(self) -> dict[str, Case]:
        if self._cases is None:
            if self.options.device == "cpu":
                from verify.devices import MAX_CPU_REPLICAS, configure_cpu_replicas

                configure_cpu_replicas(max(MAX_CPU_REPLICAS, max(self.options.replicas)))
            from cases import load_cases

            self._cases = load_cases(self.case_names, self.options)
        return self._cases

    def pairs(self) -> list[Pair]:
        selected = []
        for case in self.cases().values():
            for reference, candidate in case.all_pairs():
                impl = case.implementation(candidate)
                if impl.replicas in self.options.replicas or impl.name == case.reference:
                    selected.append(Pair(case.name, reference, candidate))
        return selected

    # ---- running ----
    def trace(self, case: Case, name: str) -> Trace:
        key = (case.name, name)
        if key not in self._traces:
            from verify.run import run_implementation

            if self._tpu_error:
                self._traces[key] = Trace(name, {"replicas": case.implementation(name).replicas},
                                          error=self._tpu_error)
            else:
                self._traces[key] = run_implementation(
                    case, case.implementation(name), steps=self.options.steps,
                    device=self.options.device, tpu_name=self.options.tpu_name)
            self._ran.append((name, float(self._traces[key].meta.get("seconds") or 0.0)))
            if self.keep_traces:
                if case.name not in self._kept_cases:
                    keep_case(self.traces_dir, case)
                    self._kept_cases.add(case.name)
                # what it declared travels with it: re-comparing re-applies preflight
                self._traces[key].meta["declared_config"] = self.declared(case, name)
                keep_trace(self.traces_dir, case.name, self._traces[key])
        return self._traces[key]

    def check(self, pair: Pair) -> Verdict:
        """Run (or reuse) both traces, compare them, persist the results and return the verdict.

        A harness error still persists a failing record for the pair before it propagates.
        """
        started, self._ran = time.perf_counter(), []
        record = {"case": pair.case, "reference": pair.reference, "candidate": pair.candidate,
                  "replicas": 0, "role": "faithful", "verdict": FAIL}
        try:
            if self.options.device == "tpu" and self._tpu_error is None:
                from verify.devices import TpuUnavailable, resolve_tpu

                try:
                    resolve_tpu(self.options.tpu_name)
                except TpuUnavailable as e:
                    self._tpu_error = str(e)
            case = self.cases()[pair.case]
            implementation = case.implementation(pair.candidate)
            record.update(replicas=implementation.replicas,
                          role="control" if implementation.is_control else "faithful")
            reference = self.trace(case, pair.reference)
            candidate = self.trace(case, pair.candidate)
            result = compare_pair(reference, candidate, case.tolerances, case=case.name,
                                  replicas=implementation.replicas, expect=implementation.expect,
                                  control=implementation.is_control)
            self._add_preflight(case, pair, result)
            self._add_attribution(case, pair, result)
        except Exception as e:
            record["message"] = f"harness error: {type(e).__name__}: {e}"
            write_part(self.parts_dir, pair.id, PairResult.failed(record), {})
            self._note_progress(pair, FAIL, started)
            raise
        write_part(self.parts_dir, pair.id, result, trace_environment(candidate))
        self._note_progress(pair, result.verdict.status, started)
        return result.verdict

    def declared(self, case: Case, name: str) -> dict:
        """The implementation's static configuration, read once per process ({} when its
        runner declares none; the error as a value when reading it fails)."""
        key = (case.name, name)
        if key not in self._configs:
            implementation = case.implementation(name)
            read = getattr(implementation.runner, "declared_config", None)
            try:
                self._configs[key] = read(case, implementation) if read else {}
            except Exception as e:  # noqa: BLE001 - reported as a finding, not a crash
                self._configs[key] = {"preflight/error": f"{type(e).__name__}: {e}"}
        return self._configs[key]

    def _add_preflight(self, case: Case, pair: Pair, result) -> None:
        """Diff what both sides declare; fold blocking findings into the verdict."""
        implementation = case.implementation(pair.candidate)
        add_preflight(result, self.declared(case, pair.reference),
                      self.declared(case, pair.candidate), expect=implementation.expect,
                      preflight_expect=implementation.preflight_expect,
                      device=self.options.device)

    def _add_attribution(self, case: Case, pair: Pair, result) -> None:
        """With an oracle in the case, say which side departs from the math."""
        from verify.attribution import attribute

        if case.oracle is None or case.oracle in (pair.reference, pair.candidate):
            return
        sentence = attribute(result.rows, self._oracle_rows(case, pair.reference),
                             self._oracle_rows(case, pair.candidate),
                             reference=pair.reference, candidate=pair.candidate)
        result.record["attribution"] = sentence
        if not result.verdict.ok:
            result.record["message"] = f"{result.record['message']} Attribution: {sentence}"

    def _oracle_rows(self, case: Case, name: str):
        """Drift rows of (oracle, `name`), compared once per process."""
        key = (case.name, name)
        if key not in self._against_oracle:
            self._against_oracle[key] = compare_traces(
                self.trace(case, case.oracle), self.trace(case, name), case.tolerances,
                case=case.name)
        return self._against_oracle[key]

    def _note_progress(self, pair: Pair, verdict: str, started: float) -> None:
        self.progress[pair.id] = {"pair": f"{pair.case}: {pair.reference} -> {pair.candidate}",
                                  "verdict": verdict,
                                  "seconds": round(time.perf_counter() - started, 3),
                                  "ran": list(self._ran)}

    # ---- report ----
    def options_record(self) -> dict:
        """The options that shape the numbers, as recorded in summaries and run records."""
        return {"device": self.options.device, "steps": self.options.steps or "case default",
                "replicas": ",".join(map(str, self.options.replicas)), "full": self.options.full,
                "cases": ",".join(self.case_names) if self.case_names else "all"}

    def write_report(self) -> list[Path]:
        """Merge the parts into the report, add the run record to the history, compare it."""
        if not self.parts_dir.is_dir() and not self.lost:
            return []   # no parity test ran in this session: leave any earlier report alone
        results = read_parts(self.parts_dir) if self.parts_dir.is_dir() else RunResults.empty()
        results.options, results.lost = self.options_record(), dict(self.lost)
        known = results.pairs.dropna(subset=["seed"])
        seeds = {str(c): int(s) for c, s in zip(known["case"], known["seed"])}
        record = run_record(results, run_id=self.run_id,
                            provenance={"git_commit": git_commit(self.root or self.report_dir),
                                        "seeds": seeds, "keep_traces": self.keep_traces})
        if self.compare_to is not None:
            if self.previous is None:
                self.notes.append(f"parity: --compare-to {self.compare_to} holds no earlier run "
                                  f"yet; nothing to compare with")
            else:
                self.comparison = compare_runs(record, self.previous, self.factor)
                record["compared_to"] = {"run_id": self.previous.get("run_id"),
                                         "regressions": self.comparison.regressions,
                                         "changes": self.comparison.changes}
        written = write_report(self.report_dir, results, record, self.comparison)
        if self.history_dir is not None:
            written.append(write_record(self.history_dir, record))
        if not self.keep_traces and self.traces_dir.is_dir():
            shutil.rmtree(self.traces_dir, ignore_errors=True)   # traces of an earlier run
        for old in self.parts_dir.parent.glob("*"):
            if old.name != self.run_id:
                shutil.rmtree(old, ignore_errors=True)   # parts of earlier runs
        self.results = results
        return written
