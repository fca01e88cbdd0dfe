"""pytest plugin: `pytest verify/` runs every case's pairs and writes the report.

A thin adapter around `verify.session.parity_session.ParitySession`: it turns options into a
session, one test per pair (`verify/test_parity.py`), progress lines, and the report at the
end. The hooks are here (the module pytest loads); the options and their start-up checks are
in `verify.session.plugin_options`, the controlling process's side in
`verify.session.parity_controller`, and the handling of SIGINT/SIGTERM in
`verify.session.interruption`.

Options: --cases, --case, --tpu/--tpu-name/--tpu-tables-every, --steps, --report-dir,
--replicas, --full, --data-dir, --keep-traces, --history-dir, --compare-to,
--regression-factor, --run-timeout.
Output directories and option files are checked when pytest starts, before anything trains.
Each finished test persists its judged pair at once under `<report-dir>/parts/<run id>/`, and
prints a progress line. The controlling process (the xdist controller under `-n`) locks the
report directory once parity tests are selected (a second session into it is refused), and
merges every part when the session ends into drift.csv.gz, summary.csv, losses.csv, summary.md,
report.html and run.json, adds the run record to the history directory and, with --compare-to,
reports regressions since an earlier run. Selected tests that left no result (an interrupted
run, -x, a lost xdist worker) make the run INCOMPLETE, and its exit status non-zero.
"""
from __future__ import annotations

import os
import shlex
import time
from pathlib import Path

import pytest

from verify.runners.case_sources import CaseSourceError, load_cases, resolve_sources
from verify.core.case import PairSpec, SuiteOptions
from verify.core.scratch import remove_stale
from verify.session.interruption import Interruption
from verify.session.parity_controller import (DESELECTED_KEY, PAIR_TEST, PROGRESS_PROPERTY,
                                      ParityController)
from verify.session.plugin_options import (absolute_source, add_options, check_outputs, golden_dir,
                                   history_dir, path_option, previous_run, project_environments,
                                   selection_options, suite_options)
from verify.render.terminal import terminal_lines
from verify.session.parity_session import ParitySession
from verify.session.scheduling import make_scheduler, write_groups

OPTIONS_KEY = pytest.StashKey[SuiteOptions]()
SESSION_KEY = pytest.StashKey["ParitySession"]()
CONTROLLER_KEY = pytest.StashKey["ParityController"]()
INTERRUPTION = Interruption()


def pytest_addoption(parser):
    add_options(parser)


def _is_xdist_worker(config) -> bool:
    return hasattr(config, "workerinput")


def pytest_configure(config):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    INTERRUPTION.first, INTERRUPTION.holding, INTERRUPTION.held = "", False, ""
    INTERRUPTION.install()
    # test_parity.py's marker, declared here too for runs without this project's pyproject.toml
    # (`python -m verify suite` from an installed package).
    config.addinivalue_line("markers", "slow: trains real implementations")
    options = suite_options(config)
    config.stash[OPTIONS_KEY] = options
    if options.device == "tpu" and (config.getoption("numprocesses", None) or 0) > 1:
        raise pytest.UsageError("--tpu runs in one process (a TPU belongs to one process at a "
                                "time); drop -n/--numprocesses")
    parity = _parity_session(config, options)
    config.stash[SESSION_KEY] = parity
    config.stash[DESELECTED_KEY] = []
    if _is_xdist_worker(config):
        return
    check_outputs(parity)
    stale = remove_stale()
    if stale:
        parity.notes.append(f"parity: removed {len(stale)} scratch director"
                            f"{'y' if len(stale) == 1 else 'ies'} of runs that are gone: "
                            + ", ".join(str(p) for p in stale[:3])
                            + (" ..." if len(stale) > 3 else ""))
    factor = config.getoption("regression_factor")
    if not factor > 1:
        raise pytest.UsageError(f"--regression-factor must be > 1 (e.g. 10), got {factor}")
    compare_to = path_option(config, "compare_to")
    if compare_to is not None:
        damaged: list[str] = []
        parity.previous = previous_run(compare_to, damaged)
        parity.factor, parity.compare_to = factor, compare_to
        parity.skipped_records = damaged
        parity.notes += [f"parity: --compare-to skipped a damaged history record: {skipped}"
                         for skipped in damaged]
    controller = ParityController(config, parity)
    config.stash[CONTROLLER_KEY] = controller
    config.pluginmanager.register(controller, "parity-controller")
    INTERRUPTION.on_first = controller.report_now


def _parity_session(config, options: SuiteOptions) -> ParitySession:
    """The session the options describe (in an xdist worker, under the controller's run id)."""
    run_id = (config.workerinput["parity_run_id"] if _is_xdist_worker(config)
              else time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}")
    report_dir = path_option(config, "report_dir")
    if not config.getoption("case_sources") and not (Path(config.rootpath) / "cases").is_dir():
        raise pytest.UsageError(f"no --cases given and {Path(config.rootpath) / 'cases'} is not a "
                                f"directory: pass your cases, e.g. --cases parity_cases (a "
                                f"directory, a case module's .py file or a module name)")
    try:
        sources = resolve_sources(config.getoption("case_sources") or ["cases"],
                                  root=Path(config.rootpath))
    except CaseSourceError as e:
        raise pytest.UsageError(str(e)) from None
    names = config.getoption("parity_cases")
    environments = project_environments(config, options)
    given = config.getoption("case_sources") or ["cases"]
    return ParitySession(options, report_dir, run_id,
                         lambda broken: load_cases(sources, options, broken=broken),
                         case_names=names, keep_traces=config.getoption("keep_traces"),
                         history_dir=history_dir(config, report_dir),
                         root=Path(config.rootpath), environments=environments,
                         sources=tuple(absolute_source(g, Path(config.rootpath))
                                       for g in given),
                         golden=golden_dir(config),
                         save_golden=path_option(config, "save_golden"),
                         selection=selection_options(config),
                         share_traces=_is_xdist_worker(config)
                         and config.workerinput.get("workercount", 1) > 1)


def pytest_unconfigure(config):
    INTERRUPTION.uninstall()
    INTERRUPTION.on_first = None
    parity = config.stash.get(SESSION_KEY, None)
    if parity is not None:
        parity.close()   # its environment processes
    controller = config.stash.get(CONTROLLER_KEY, None)
    if controller is not None:
        controller.lock.release()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist: every worker writes its parts under the controller's run id."""
    node.workerinput["parity_run_id"] = node.config.stash[SESSION_KEY].run_id


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """xdist: the parity pairs of one reference, or of one destination environment, share a
    worker (`verify.session.scheduling`); another project's conftest.py can add its own groups
    through `make_scheduler`."""
    return make_scheduler(config, log, config.stash[SESSION_KEY].parts_dir)


@pytest.hookimpl(tryfirst=True)   # before xdist's worker sends its collection to the controller
def pytest_collection_finish(session):
    """Tell the parity session which pairs it will judge (after -k and other deselection), so
    the case.json kept with --keep-traces lists exactly the pairs whose traces it keeps; in an
    xdist worker, write their scheduling groups for the controller."""
    pairs = [_pair_of(item) for item in session.items]
    parity = session.config.stash[SESSION_KEY]
    parity.kept_pairs = [pair for pair in pairs if pair is not None]
    if _is_xdist_worker(session.config) and parity.kept_pairs:
        try:
            write_groups(parity.parts_dir, parity.kept_pairs, parity.cases())
        except Exception:  # noqa: BLE001 - without groups each pair is scheduled alone
            pass


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


def pytest_sessionfinish(session, exitstatus):
    config = session.config
    if _is_xdist_worker(config):
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
    INTERRUPTION.hold()   # ^C from here on: the final report is still written whole
    parity.written = parity.write_report()
    if parity.results is not None and not parity.results.complete and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED   # a partial run is never green
    if INTERRUPTION.held:
        parity.notes.append(f"parity: {INTERRUPTION.held} arrived while the final report was "
                            f"written: it was written whole, then the run ended")
        session.exitstatus = pytest.ExitCode.INTERRUPTED


def _deselected_message(config) -> str:
    filters = [f"{flag} {shlex.quote(value)}" for flag, value in
               (("-k", config.option.keyword), ("-m", config.option.markexpr)) if value]
    count = len(config.stash[DESELECTED_KEY])
    return (f"no pair selected: {' '.join(filters) or 'the selection'} deselected all {count} "
            f"parity tests; their ids read test_pair[<case>:<reference>-vs-<candidate>] (list "
            f"them with --collect-only -q)")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if _is_xdist_worker(config):
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
    """The session's parity harness: traces run once each, comparison, persisted results."""
    return request.config.stash[SESSION_KEY]
