"""The controlling process's side of a parity session (`ParityController`, registered by
verify/plugin.py): which parity tests the run selected, the report directory's lock, a
progress line per finished pair, and what stopped the session early."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from verify.session.interruption import stop_children
from verify.judge.kernel_warmup import start_warmup
from verify.store.report_dir import ReportDirBusy, ReportLock, mark_in_progress
from verify.session.parity_session import ParitySession

DESELECTED_KEY = pytest.StashKey[list]()   # node ids of parity tests that -k/-m deselected
PROGRESS_PROPERTY = "parity"
PAIR_TEST = "::test_pair["    # the parity test of verify/test_parity.py, as its node ids read


def may_run_parity(config) -> bool:
    """Whether the paths pytest collects from include verify/test_parity.py."""
    parity_test = (Path(__file__).parent.parent / "test_parity.py").resolve()
    here = Path(config.invocation_params.dir)
    for arg in config.args:
        path = (here / str(arg).split("::", 1)[0]).resolve()
        if path == parity_test or path in parity_test.parents:
            return True
    return False


class ParityController:
    """The controlling process's side of a session: which parity tests the run selected (and
    the report directory's lock, taken once there are some), a terminal line per finished
    pair with the elapsed time, the pairs that crashed, and why the session stopped early; it
    starts the comparison kernels' warm-up (`verify.judge.kernel_warmup`).

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
        if not self.config.option.collectonly and may_run_parity(self.config):
            self.own_report_dir(exit_if_busy=True)
            start_warmup()   # the comparison kernels compile while the first runs train

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
        stop_children()

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
        waited = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in info.get("waited", []))
        self._write(f"parity {self.done:>3} [{time.monotonic() - self.started:7.1f}s] "
                    f"{info['verdict']:<6} {info['pair']} ({info['seconds']:.1f}s"
                    + (f"; ran {ran}" if ran else "")
                    + (f"; waited for {waited}" if waited else "") + ")")

    def _write(self, line: str) -> None:
        writer = self.config.pluginmanager.get_plugin("terminalreporter")
        if writer is None or self.config.get_verbosity() < -1:
            return
        if getattr(getattr(writer, "_tw", None), "width_of_current_line", 0):
            writer.write("\n")   # after the progress dots of -q and xdist
        writer.write_line(line)

