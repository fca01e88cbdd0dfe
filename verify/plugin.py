"""pytest plugin: `pytest verify/` runs every case's pairs and writes the report.

Options: --tpu/--tpu-name, --steps, --report-dir, --replicas, --full, --data-dir, --case.
Each test compares one (reference, candidate) pair of one case. Traces are run once per
process and cached; each finished test persists its drift rows at once under
`<report-dir>/parts/<run id>/`, and the controlling process (the xdist controller under
`-n`) merges every part into drift.csv, summary.csv and summary.md when the session ends.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import time
from pathlib import Path

import pytest

from verify.case import Case, SuiteOptions
from verify.compare import compare_traces
from verify.report import read_parts, terminal_lines, write_part, write_report
from verify.trace import Trace
from verify.verdict import Verdict, judge

OPTIONS_KEY = pytest.StashKey[SuiteOptions]()
SESSION_KEY = pytest.StashKey["ParitySession"]()


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


def pytest_configure(config):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    options = _options(config)
    config.stash[OPTIONS_KEY] = options
    if options.device == "tpu" and (config.getoption("numprocesses", None) or 0) > 1:
        raise pytest.UsageError("--tpu runs in one process (a TPU belongs to one process at a "
                                "time); drop -n/--numprocesses")
    run_id = (config.workerinput["parity_run_id"] if _is_worker(config)
              else time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}")
    report_dir = Path(config.getoption("report_dir"))
    if not report_dir.is_absolute():
        report_dir = Path(config.rootpath) / report_dir
    config.stash[SESSION_KEY] = ParitySession(options, report_dir, run_id,
                                              config.getoption("parity_cases"))


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist: every worker writes its parts under the controller's run id."""
    node.workerinput["parity_run_id"] = node.config.stash[SESSION_KEY].run_id


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
        for line in terminal_lines(parity.pairs_table, parity.written):
            terminalreporter.write_line(line)


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
                 case_names: list[str] | None):
        self.options, self.report_dir, self.run_id = options, report_dir, run_id
        self.case_names = case_names
        self.parts_dir = report_dir / "parts" / run_id
        self._cases: dict[str, Case] | None = None
        self._traces: dict[tuple[str, str], Trace] = {}
        self._tpu_error: str | None = None
        self.written: list[Path] = []
        self.pairs_table = None

    # ---- collection ----
    def cases(self) -> dict[str, Case]:
        if self._cases is None:
            if self.options.device == "cpu":
                from verify.devices import configure_cpu_replicas

                configure_cpu_replicas(max(8, max(self.options.replicas)))
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
        return self._traces[key]

    def check(self, pair: Pair) -> Verdict:
        """Run (or reuse) both traces, compare them, persist the rows and return the verdict."""
        if self.options.device == "tpu" and self._tpu_error is None:
            from verify.devices import TpuUnavailable, resolve_tpu

            try:
                resolve_tpu(self.options.tpu_name)
            except TpuUnavailable as e:
                self._tpu_error = str(e)
        case = self.cases()[pair.case]
        implementation = case.implementation(pair.candidate)
        reference, candidate = self.trace(case, pair.reference), self.trace(case, pair.candidate)
        rows = compare_traces(reference, candidate, case.tolerances, case=case.name,
                              replicas=implementation.replicas)
        verdict = judge(rows, implementation.expect)
        d = verdict.divergence
        record = {"case": case.name, "reference": pair.reference, "candidate": pair.candidate,
                  "replicas": implementation.replicas,
                  "role": "control" if implementation.is_control else "faithful",
                  "verdict": verdict.status, "first_step": d.step if d else None,
                  "first_quantity": d.quantity if d else "", "first_tensor": d.tensor if d else "",
                  "margin": verdict.margin, "message": verdict.message,
                  "expected": (f"step {implementation.expect.step} "
                               f"{implementation.expect.quantity}")
                  if implementation.expect else "",
                  "seconds": candidate.meta.get("seconds")}
        environment = {k: candidate.meta.get(k) for k in
                       ("tensorflow", "numpy", "python", "platform", "cpu", "device")}
        write_part(self.parts_dir, pair.id, rows, record, environment)
        return verdict

    # ---- report ----
    def write_report(self) -> list[Path]:
        if not self.parts_dir.is_dir():
            return []   # no parity test ran in this session: leave any earlier report alone
        rows, pairs, environment = read_parts(self.parts_dir)
        self.pairs_table = pairs
        options = {"device": self.options.device, "steps": self.options.steps or "case default",
                   "replicas": ",".join(map(str, self.options.replicas)),
                   "full": self.options.full}
        written = write_report(self.report_dir, rows, pairs, environment, options)
        for old in (self.report_dir / "parts").iterdir():
            if old.name != self.run_id:
                shutil.rmtree(old, ignore_errors=True)
        return written
