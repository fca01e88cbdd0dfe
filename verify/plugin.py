"""pytest plugin: `pytest verify/` runs every case's pairs and writes the report.

A thin adapter around `verify.session.ParitySession`: it turns options into a session, one
test per pair (`verify/test_parity.py`), progress lines, and the report at the end.

Options: --cases, --case, --tpu/--tpu-name/--tpu-tables-every, --steps, --report-dir,
--replicas, --full, --data-dir, --keep-traces, --history-dir, --compare-to,
--regression-factor, --run-timeout.
Output directories and option files are checked when pytest starts, before anything trains.
Each finished test persists its judged pair at once under `<report-dir>/parts/<run id>/`, and
prints a progress line. The controlling process (the xdist controller under `-n`) locks the
report directory once parity tests are selected (a second session into it is refused), and
merges every part when the session ends into drift.csv, summary.csv, losses.csv, summary.md,
report.html and run.json, adds the run record to the history directory and, with --compare-to,
reports regressions since an earlier run. Selected tests that left no result (an interrupted
run, -x, a lost worker) make the run INCOMPLETE, and its exit status non-zero.
"""
from __future__ import annotations

import os
import shlex
import signal
import threading
import time
from pathlib import Path

import pytest

from verify.case_sources import CaseSourceError, load_cases, resolve_sources
from verify.core.case import DEFAULT_RUN_TIMEOUT, PairSpec, SuiteOptions
from verify.core.meta import SUITE_ENVIRONMENT
from verify.core.scratch import remove_stale
from verify.history import DEFAULT_FACTOR, check_record, load_record
from verify.render.terminal import terminal_lines
from verify.report_dir import (OutputNotWritable, ReportDirBusy, ReportLock, check_writable,
                               mark_in_progress)
from verify.environments.declared import declared_environments
from verify.session import ParitySession

OPTIONS_KEY = pytest.StashKey[SuiteOptions]()
SESSION_KEY = pytest.StashKey["ParitySession"]()
CONTROLLER_KEY = pytest.StashKey["ParityController"]()
DESELECTED_KEY = pytest.StashKey[list]()   # node ids of parity tests that -k/-m deselected
PROGRESS_PROPERTY = "parity"
PAIR_TEST = "::test_pair["    # the parity test of verify/test_parity.py, as its node ids read


def pytest_addoption(parser):
    group = parser.getgroup("parity", "numerical parity of TensorFlow migrations")
    group.addoption("--tpu", action="store_true",
                    help="run the implementations on a real TPU (TPUClusterResolver); fails, "
                         "saying why, when no TPU is reachable")
    group.addoption("--tpu-name", default="", help="TPU name or grpc address ('' = local TPU VM)")
    group.addoption("--tpu-tables-every", type=int, default=None, metavar="K",
                    help="with --tpu: read the embedding tables and their slots back from the "
                         "TPU every K steps (default every step for runs of up to 100 steps, "
                         "about 100 reads for longer ones)")
    group.addoption("--steps", type=int, default=None,
                    help="training steps per run (default: each case's own)")
    group.addoption("--report-dir", default="reports", help="where the report is written")
    group.addoption("--replicas", default="1,2,4,8",
                    help="comma-separated replica counts of candidates to run (default 1,2,4,8)")
    group.addoption("--sensitivity", action="store_true",
                    help="add automatic mutants (learning rate x1.01, gradients clipped at "
                         "their median norm, one step's gradients dropped) of every faithful "
                         "candidate; shipped cases run theirs always")
    group.addoption("--full", action="store_true",
                    help="the long tier: cases run their full-length training")
    group.addoption("--data-dir", default=None, help="directory with real datasets for cases")
    group.addoption("--case", action="append", default=None, dest="parity_cases",
                    help="run only this case (repeatable)")
    group.addoption("--cases", action="append", default=None, dest="case_sources",
                    help="where cases come from: a directory of case modules, a case module's "
                         ".py file or an importable module name (repeatable; default the "
                         "project's cases/ directory)")
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
    group.addoption("--save-golden", default=None, metavar="DIR",
                    help="store the reference trace of every judged pair in DIR (golden "
                         "references, see verify/golden.py)")
    group.addoption("--golden", default=None, metavar="DIR",
                    help="read implementations that are no selected pair's candidate from the "
                         "golden references in DIR instead of running them")
    group.addoption("--env", action="append", default=None, dest="parity_envs",
                    help="only pairs whose candidate runs in this environment (repeatable; "
                         "'local' is the suite's own; see python -m verify envs list)")
    group.addoption("--run-timeout", type=float, default=DEFAULT_RUN_TIMEOUT,
                    help=f"seconds one run of one implementation may take; a longer run fails "
                         f"with the steps it captured (default {DEFAULT_RUN_TIMEOUT:g}; 0 for "
                         f"no limit)")


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
    every = config.getoption("tpu_tables_every")
    if every is not None and every < 1:
        raise pytest.UsageError(f"--tpu-tables-every takes a number of steps >= 1, got {every}")
    timeout = config.getoption("run_timeout")
    if not timeout >= 0:
        raise pytest.UsageError(f"--run-timeout takes seconds >= 0 (0 for no limit), got "
                                f"{timeout:g}")
    envs = tuple(e for given in config.getoption("parity_envs") or () for e in given.split(",")
                 if e.strip())
    return SuiteOptions(steps=steps, device="tpu" if config.getoption("tpu") else "cpu",
                        environments=envs,
                        tpu_name=config.getoption("tpu_name"), tpu_tables_every=every,
                        replicas=replicas,
                        full=config.getoption("full"),
                        sensitivity=config.getoption("sensitivity"),
                        data_dir=Path(data_dir) if data_dir else None,
                        run_timeout=timeout or None)


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


class Interruption:
    """How a session stops on SIGINT or SIGTERM (how CI systems cancel a job: GitHub sends
    SIGINT, then SIGTERM 7.5 s later, then SIGKILL; GitLab, Jenkins and Kubernetes send SIGTERM
    first). Either signal ends the session as Ctrl-C does (KeyboardInterrupt). In the
    controlling process the first one also writes the INCOMPLETE report of the pairs judged
    so far at once, before pytest waits for its workers, so a job killed soon after still
    leaves a report; later signals are noted but do not interrupt the writing of the final
    report.
    """

    def __init__(self):
        self.first: str = ""
        self.on_first = None      # the controller's early report, set once it exists

    def install(self) -> None:
        """Handle SIGINT and SIGTERM in this process, unless someone else already does (a
        SIGINT ignored by a background job stays ignored)."""
        if threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, self.handle)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, self.handle)

    def uninstall(self) -> None:
        for signum, default in ((signal.SIGTERM, signal.SIG_DFL),
                                (signal.SIGINT, signal.default_int_handler)):
            if signal.getsignal(signum) == self.handle:
                signal.signal(signum, default)

    def handle(self, signum, frame):
        name = signal.Signals(signum).name
        if self.first:   # already stopping: let the report be written
            return
        self.first = name
        if self.on_first is not None:
            try:
                self.on_first(name)
            except Exception:  # noqa: BLE001 - the final report is still written at the end
                pass
        raise KeyboardInterrupt(f"stopped by {name}")


INTERRUPTION = Interruption()


def _stop_children() -> None:
    """SIGTERM to this process's children (pytest-xdist's workers, environment workers), so
    that a cancelled session ends in seconds instead of waiting for the runs under way; each
    worker stops as the session does (an interrupted pair is reported as not run)."""
    me = str(os.getpid())
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[1] == me:    # the parent pid
            try:
                os.kill(int(stat.parent.name), signal.SIGTERM)
            except OSError:
                pass


def pytest_configure(config):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    INTERRUPTION.first = ""
    INTERRUPTION.install()
    # test_parity.py's marker, declared here too for runs without this project's pyproject.toml
    # (`python -m verify suite` from an installed package).
    config.addinivalue_line("markers", "slow: trains real implementations")
    options = _options(config)
    config.stash[OPTIONS_KEY] = options
    if options.device == "tpu" and (config.getoption("numprocesses", None) or 0) > 1:
        raise pytest.UsageError("--tpu runs in one process (a TPU belongs to one process at a "
                                "time); drop -n/--numprocesses")
    run_id = (config.workerinput["parity_run_id"] if _is_worker(config)
              else time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}")
    report_dir = _path_option(config, "report_dir")
    try:
        sources = resolve_sources(config.getoption("case_sources") or ["cases"],
                                  root=Path(config.rootpath))
    except CaseSourceError as e:
        raise pytest.UsageError(str(e)) from None
    names = config.getoption("parity_cases")
    environments = _environments(config, options)
    given = config.getoption("case_sources") or ["cases"]
    parity = ParitySession(options, report_dir, run_id,
                           lambda broken: load_cases(sources, options, broken=broken),
                           case_names=names, keep_traces=config.getoption("keep_traces"),
                           history_dir=_history_dir(config, report_dir),
                           root=Path(config.rootpath), environments=environments,
                           sources=tuple(_absolute_source(g, Path(config.rootpath))
                                         for g in given),
                           golden=_golden_dir(config), save_golden=_path_option(config, "save_golden"))
    config.stash[SESSION_KEY] = parity
    config.stash[DESELECTED_KEY] = []
    if _is_worker(config):
        return
    _check_outputs(parity)
    stale = remove_stale()
    if stale:
        parity.notes.append(f"parity: removed {len(stale)} scratch director"
                            f"{'y' if len(stale) == 1 else 'ies'} of runs that are gone: "
                            + ", ".join(str(p) for p in stale[:3])
                            + (" ..." if len(stale) > 3 else ""))
    factor = config.getoption("regression_factor")
    if not factor > 1:
        raise pytest.UsageError(f"--regression-factor must be > 1 (e.g. 10), got {factor}")
    compare_to = _path_option(config, "compare_to")
    if compare_to is not None:
        damaged: list[str] = []
        parity.previous = _previous_run(compare_to, damaged)
        parity.factor, parity.compare_to = factor, compare_to
        parity.skipped_records = damaged
        parity.notes += [f"parity: --compare-to skipped a damaged history record: {skipped}"
                         for skipped in damaged]
    controller = ParityController(config, parity)
    config.stash[CONTROLLER_KEY] = controller
    config.pluginmanager.register(controller, "parity-controller")
    INTERRUPTION.on_first = controller.report_now


def _environments(config, options: SuiteOptions) -> dict:
    """The environments the rootdir's pyproject.toml declares; --env must name them."""
    pyproject = Path(config.rootpath) / "pyproject.toml"
    try:
        declared = declared_environments(pyproject)
    except ValueError as e:
        raise pytest.UsageError(str(e)) from None
    unknown = sorted(set(options.environments) - set(declared) - {SUITE_ENVIRONMENT})
    if unknown:
        raise pytest.UsageError(f"--env {','.join(unknown)}: not declared in {pyproject}; "
                                f"known: {', '.join([SUITE_ENVIRONMENT, *sorted(declared)])}")
    return declared


def _golden_dir(config) -> Path | None:
    golden = _path_option(config, "golden")
    if golden is not None and not golden.is_dir():
        raise pytest.UsageError(f"--golden {golden} is not a directory of golden references "
                                f"(write one with --save-golden {golden})")
    if golden is not None and config.getoption("save_golden"):
        raise pytest.UsageError("--golden and --save-golden together would store goldens read "
                                "from goldens: use one")
    return golden


def _absolute_source(given: str, root: Path) -> str:
    """A case source as another process can find it: paths made absolute."""
    for path in (Path(given), root / given):
        if path.exists():
            return str(path.resolve())
    return given


def _check_outputs(parity: ParitySession) -> None:
    """Fail now, before anything trains, when a report or history cannot be written."""
    outputs = [("--report-dir", parity.report_dir)]
    for variable in ("PARITY_SPILL_DIR", "PARITY_ENV_DIR"):   # scratch and environments
        value = os.environ.get(variable, "").strip()
        if value:
            outputs.append((f"{variable}=", Path(value)))
    if parity.history_dir is not None:
        outputs.append(("--history-dir", parity.history_dir))
    if parity.save_golden is not None:
        outputs.append(("--save-golden", parity.save_golden))
    for option, directory in outputs:
        try:
            check_writable(directory, option)
        except OutputNotWritable as e:
            raise pytest.UsageError(str(e)) from None


def _previous_run(path: Path, damaged: list[str]) -> dict | None:
    """The --compare-to run record, checked now so that comparing at the end cannot fail. In a
    history directory, damaged records are skipped and named in `damaged` (the report says
    which run it compared with instead)."""
    try:
        record = load_record(path, damaged=damaged)
        if record is not None:
            check_record(record)
    except (FileNotFoundError, ValueError) as e:
        raise pytest.UsageError(f"--compare-to {path}: {e}") from None
    return record


def pytest_unconfigure(config):
    INTERRUPTION.uninstall()
    INTERRUPTION.on_first = None
    parity = config.stash.get(SESSION_KEY, None)
    if parity is not None:
        parity.close()   # its worker processes
    controller = config.stash.get(CONTROLLER_KEY, None)
    if controller is not None:
        controller.lock.release()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist: every worker writes its parts under the controller's run id."""
    node.workerinput["parity_run_id"] = node.config.stash[SESSION_KEY].run_id


def pytest_collection_finish(session):
    """Tell the parity session which pairs it will judge (after -k and other deselection), so
    the case.json kept with --keep-traces lists exactly the pairs whose traces it keeps."""
    pairs = [_pair_of(item) for item in session.items]
    session.config.stash[SESSION_KEY].kept_pairs = [pair for pair in pairs if pair is not None]


def _pair_of(item) -> PairSpec | None:
    """The pair a parity test checks; None for any other test."""
    pair = item.callspec.params.get("pair") if hasattr(item, "callspec") else None
    return pair if isinstance(pair, PairSpec) else None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Attach the pair's progress facts to its test report (xdist carries them to the
    controller)."""
    try:
        return (yield)
    finally:
        pair = _pair_of(item)
        if pair is not None:
            info = item.config.stash[SESSION_KEY].progress.pop(pair.id, None)
            if info is not None:
                item.user_properties.append((PROGRESS_PROPERTY, info))


def pytest_deselected(items):
    """Remember parity tests that -k/-m deselected: a run left with none says so."""
    for item in items:
        if PAIR_TEST in item.nodeid:
            item.config.stash[DESELECTED_KEY].append(item.nodeid)


def _may_run_parity(config) -> bool:
    """Whether the paths pytest collects from include verify/test_parity.py."""
    parity_test = (Path(__file__).parent / "test_parity.py").resolve()
    here = Path(config.invocation_params.dir)
    for arg in config.args:
        path = (here / str(arg).split("::", 1)[0]).resolve()
        if path == parity_test or path in parity_test.parents:
            return True
    return False


class ParityController:
    """The controlling process's side of a session: which parity tests the run selected (and
    the report directory's lock, taken once there are some), a terminal line per finished
    pair with the elapsed time, the pairs that crashed, and why the session stopped early.

    Registered in the controlling process only: under xdist it hears of every worker's
    collection and test (`pytest_xdist_node_collection_finished`, `pytest_runtest_logreport`),
    and of a dead worker's test as a crash report.
    """

    def __init__(self, config, parity: "ParitySession"):
        self.config, self.parity = config, parity
        self.lock = ReportLock(parity.report_dir)
        self.refused = ""     # why the report directory could not be locked
        self.started = time.monotonic()
        self.done = 0

    def pytest_sessionstart(self, session):
        """When the session's paths include the parity test, the report directory says IN
        PROGRESS from now on, before any case module is imported (an import that hangs, or a
        cancel during collection, then never leaves an earlier run's verdict standing)."""
        if not self.config.option.collectonly and _may_run_parity(self.config):
            self.own_report_dir(exit_if_busy=True)

    def pytest_collection_finish(self, session):
        self._selected([item.nodeid for item in session.items])

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids):
        self._selected(ids)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node, error):
        deselected = getattr(node, "workeroutput", {}).get("parity_deselected", [])
        known = self.config.stash[DESELECTED_KEY]
        known += [nodeid for nodeid in deselected if nodeid not in known]

    def pytest_keyboard_interrupt(self, excinfo):
        """SIGINT (a CI job's timeout), -x under xdist, a collection error, pytest.exit."""
        value = str(excinfo.value)
        self.parity.stopped = f"interrupted: {value}" if value else (
            f"interrupted by {excinfo.typename}")

    def report_now(self, signal_name: str) -> None:
        """On the first SIGINT/SIGTERM: the INCOMPLETE report of the pairs judged so far,
        written before pytest stops its workers (the final one replaces it)."""
        if self.lock.held:
            self.parity.stopped = f"interrupted: stopped by {signal_name}"
            self.parity.write_report(final=False)
        _stop_children()

    def _selected(self, ids) -> None:
        known = set(self.parity.selected)
        self.parity.selected += [i for i in ids if PAIR_TEST in i and i not in known]
        self.parity.collected = True
        if self.parity.selected and not self.config.option.collectonly:
            self.own_report_dir(exit_if_busy=True)

    def own_report_dir(self, exit_if_busy: bool = False) -> bool:
        """Hold the report directory's lock (taken once); False when another run holds it."""
        if self.lock.held or self.refused:
            return self.lock.held
        try:
            self.lock.acquire(self.parity.run_id)
        except ReportDirBusy as e:
            self.refused = str(e)
            if exit_if_busy:
                pytest.exit(f"parity: {e}", returncode=pytest.ExitCode.USAGE_ERROR)
            return False
        # from now on the directory says a run is writing it, never an earlier verdict
        mark_in_progress(self.parity.report_dir, self.parity.run_id)
        return True

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
    config = session.config
    if _is_worker(config):
        config.workeroutput["parity_deselected"] = list(config.stash[DESELECTED_KEY])
        return
    controller, parity = config.stash[CONTROLLER_KEY], config.stash[SESSION_KEY]
    if config.option.collectonly:
        return
    if exitstatus == pytest.ExitCode.INTERRUPTED and not parity.stopped:
        parity.stopped = "interrupted (exit status 2)"
    early = session.shouldstop or session.shouldfail
    if early:
        parity.halted = f"the run stopped early ({early})"
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED and config.stash[DESELECTED_KEY]:
        parity.nothing_selected = _deselected_message(config)
    if not (parity.selected or parity.nothing_selected) and not parity.parts_dir.is_dir():
        return    # no parity test in this session: leave the report directory alone
    if not controller.own_report_dir():
        parity.notes.append(f"parity: nothing written: {controller.refused}")
        return
    parity.written = parity.write_report()
    if parity.results is not None and not parity.results.complete and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED   # a partial run is never green


def _deselected_message(config) -> str:
    filters = [f"{flag} {shlex.quote(value)}" for flag, value in
               (("-k", config.option.keyword), ("-m", config.option.markexpr)) if value]
    count = len(config.stash[DESELECTED_KEY])
    return (f"no pair selected: {' '.join(filters) or 'the selection'} deselected all {count} "
            f"parity tests; their ids read test_pair[<case>:<reference>-vs-<candidate>] (list "
            f"them with --collect-only -q)")


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
