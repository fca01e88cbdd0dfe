"""One parity session: run each implementation at most once per process, judge pairs, persist
every judged pair at once, and write the report, the run record and the history at the end.

The session knows nothing of pytest: `verify.plugin` (pytest) and `verify.__main__` (CLI) are
thin adapters around it. Cases come from a loader, so they can live anywhere
(`verify.case_sources`); a source that fails to load becomes a failing pair of its own.

The report covers exactly what the run judged: the adapter tells the session which tests it
selected and why it stopped early, and a selected test that left no part is listed as not run
(the verdict is then INCOMPLETE, never PASS).

>>> session = ParitySession(SuiteOptions(), Path("/tmp/r"), "run-1", lambda broken: {})
>>> session.pairs()
[]
>>> session.selection()[0].why
'no pair selected: the case sources declare no case (a case module defines CASE, ...)'
"""
from __future__ import annotations

import dataclasses
import re
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, ClassVar

from verify.case_sources import CaseSourceError
from verify.core.case import Case, PairSpec, SuiteOptions
from verify.core.meta import Environment, current_environment
from verify.core.trace import Trace
from verify.history import (DEFAULT_FACTOR, RunComparison, compare_runs, git_commit,
                            run_record, write_record)
from verify.judge import PairRecord, PairResult, judge_pair
from verify.judge.verdict import FAIL
from verify.kept_traces import (TRACES_DIR, keep_case, keep_trace, mark_unfinished,
                                suite_traces)
from verify.render import write_report
from verify.core.scratch import pid_alive
from verify.report_dir import record_report_files
from verify.results import (RunResults, judged_tests, read_parts, write_nothing_selected,
                            write_part)
from verify.sensitivity import KINDS, base_candidate, is_mutant, resolve, with_mutants

# --sensitivity on a case that lists no kinds: every kind but epsilon (not every optimizer
# has one; a case lists it where its optimizers do)
DEFAULT_KINDS = tuple(k for k in KINDS if k != "epsilon")

# A run's parts directory: <date>-<time>-<pid> (verify.plugin's run id).
RUN_DIR = re.compile(r"^\d{8}-\d{6}-(\d+)$")

# Loads every case by name, putting each source that fails to load into the dict it is given
# (module name -> error) instead of raising.
CaseLoader = Callable[[dict[str, str]], dict[str, Case]]
SOURCE, IMPORT = "(source)", "(import)"   # the pair standing for a source that failed to load


@dataclasses.dataclass(frozen=True)
class NoPairs:
    """Stands in for the pairs when the selection holds none: its test fails saying why."""

    why: str
    id: ClassVar[str] = "no-pair-selected"


class ParitySession:
    """Runs implementations (each at most once per process), judges pairs, keeps results."""

    def __init__(self, options: SuiteOptions, report_dir: Path, run_id: str,
                 load_cases: CaseLoader, *, case_names: list[str] | None = None,
                 keep_traces: bool = False, history_dir: Path | None = None,
                 root: Path | None = None, environments: dict | None = None,
                 sources: tuple[str, ...] = (), golden: Path | None = None,
                 save_golden: Path | None = None):
        self.options, self.report_dir, self.run_id = options, report_dir, run_id
        self.case_names, self._load_cases = case_names, load_cases
        self.parts_dir = report_dir / "parts" / run_id
        self.traces_dir = report_dir / TRACES_DIR
        self.staged_traces = self.parts_dir / TRACES_DIR   # this run's, until its report
        self.keep_traces, self.history_dir, self.root = keep_traces, history_dir, root
        # Implementations in other environments run in worker processes of those environments
        # (verify.environments.pool), asked by case sources and names.
        self.environments, self.sources = dict(environments or {}), tuple(sources)
        self._pool = None
        # --golden: implementations that are no selected pair's candidate are read from there;
        # --save-golden: the references this run judges against are stored there at the end.
        self.golden, self.save_golden = golden, save_golden
        self.staged_goldens = self.parts_dir / "golden"
        self.previous: dict | None = None      # --compare-to's run record
        self.skipped_records: list[str] = []   # damaged history records it was chosen past
        self.compare_to: Path | None = None
        self.factor = DEFAULT_FACTOR
        self._cases: dict[str, Case] | None = None
        self._traces: dict[tuple[str, str], Trace] = {}
        self._oracle_rows: dict[str, dict] = {}   # case -> (oracle vs implementation) rows
        self._kept_cases: set[str] = set()
        self._resolved: dict[tuple[str, str], object] = {}   # mutants completed at run time
        # The pairs this session judges, when fewer than `pairs()` (pytest's -k): set by the
        # adapter once it knows them, so a kept case.json lists exactly the pairs kept.
        self.kept_pairs: list[PairSpec] | None = None
        self._tpu_error: str | None = None
        self.ran: list[tuple[str, float]] = []   # (implementation, seconds) run by a check
        self.progress: dict[str, dict] = {}      # pair id -> what its check did
        self.lost: dict[str, str] = {}           # test id -> why it left no result
        self.broken: dict[str, str] = {}         # case source module -> why it did not load
        self.selected: list[str] = []            # ids of the tests this run selected
        self.collected = False                   # the adapter knows the whole selection
        self.stopped = ""                        # why the session was interrupted, if it was
        self.halted = ""                         # why later tests did not run (e.g. -x)
        self.nothing_selected = ""               # why the selection held no pair (-k, ...)
        self.notes: list[str] = []
        self.written: list[Path] = []
        self.results: RunResults | None = None
        self.comparison: RunComparison | None = None

    # ---- collection ----
    def all_cases(self) -> dict[str, Case]:
        """Every case the sources declare, loaded once (sources that fail go to `broken`)."""
        if self._cases is None:
            if self.options.device == "cpu":
                from verify.runners.capture.devices import MAX_CPU_REPLICAS, configure_cpu_replicas

                configure_cpu_replicas(max(MAX_CPU_REPLICAS, max(self.options.replicas)))
            cases = self._load_cases(self.broken)
            for name, case in cases.items():
                kinds = case.sensitivity or (DEFAULT_KINDS if self.options.sensitivity else ())
                if kinds:
                    cases[name] = with_mutants(case, kinds, self.options.steps,
                                               every_candidate=self.options.sensitivity)
            self._cases = cases
        return self._cases

    def cases(self) -> dict[str, Case]:
        """The selected cases (`case_names`, else all); unknown names are an error unless a
        source failed to load (it may declare them, and fails as a pair of its own)."""
        found = self.all_cases()
        if not self.case_names:
            return found
        unknown = sorted(set(self.case_names) - set(found))
        if unknown and not self.broken:
            raise CaseSourceError(f"unknown case(s) {unknown}; known: {sorted(found)}")
        return {name: case for name, case in found.items() if name in self.case_names}

    def pairs(self) -> list[PairSpec]:
        """The pairs of the selected cases and replica counts (the reference always runs),
        and one failing pair per case source that did not load."""
        cases = self.cases()   # loading them finds the broken sources
        selected = [PairSpec(name, SOURCE, IMPORT) for name in self.broken]
        wanted = self.options.environments
        for case in cases.values():
            for spec in case.pair_specs(self.options.device):
                if wanted and case.implementation(spec.candidate).environment not in wanted:
                    continue
                if spec.replicas in self.options.replicas or spec.candidate == case.reference:
                    selected.append(spec)
        return selected

    def selection(self) -> list[PairSpec | NoPairs]:
        """What the parity test runs: the pairs, or one `NoPairs` saying why there are none."""
        try:
            return self.pairs() or [NoPairs(self._why_no_pair())]
        except CaseSourceError as e:
            return [NoPairs(f"no pair selected: {e}")]
        except Exception as e:  # noqa: BLE001 - reported as the run's result, not a crash
            return [NoPairs(f"no pair selected: loading the cases failed: "
                            f"{type(e).__name__}: {e}")]

    def _why_no_pair(self) -> str:
        cases = self.cases()
        if not cases:
            return ("no pair selected: the case sources declare no case (a case module defines "
                    "CASE, CASES or cases(options))")
        counts = {name: sorted({s.replicas for s in case.pair_specs()})
                  for name, case in cases.items()}
        if not any(counts.values()):
            return (f"no pair selected: the selected cases {sorted(cases)} declare no pair (a "
                    f"case needs a reference and another implementation, or `pairs`)")
        scope = " ".join(f"--case {n}" for n in self.case_names or ()) or "the cases"
        known = "; ".join(f"{name}: {', '.join(map(str, c))}" for name, c in counts.items() if c)
        return (f"no pair selected: --replicas {','.join(map(str, self.options.replicas))} "
                f"matches no candidate of {scope}; candidates train on these replica counts: "
                f"{known}; pass --replicas with some of them")

    # ---- running ----
    def trace(self, case: Case, name: str) -> Trace:
        """The trace of implementation `name`, run once per process."""
        key = (case.name, name)
        if key not in self._traces:
            from verify.runners.run import run_implementation

            implementation = self._resolved.get(key) or case.implementation(name)
            steps = self.options.steps or case.steps
            if self.golden is not None and name not in self._candidates(case):
                from verify.golden import golden_trace

                trace = golden_trace(self.golden, case, implementation, steps)
                recorded = trace.meta.environment.tensorflow
                here = Environment.current().tensorflow
                if trace.error is None and recorded and here and recorded != here:
                    self.notes.append(
                        f"parity: the golden of {case.name}/{name} was recorded under TF "
                        f"{recorded}; this run has TF {here}: its pairs may differ for that "
                        f"reason alone (record the goldens again with --save-golden)")
            elif self._tpu_error:
                trace = Trace(name, {"replicas": implementation.replicas,
                                     "case": case.name, "data_digest": case.data_digest()},
                              error=self._tpu_error)
            elif implementation.environment != current_environment():
                trace = self._run_elsewhere(case, implementation)
            else:
                trace = run_implementation(
                    case, implementation, steps=self.options.steps,
                    device=self.options.device, tpu_name=self.options.tpu_name,
                    timeout=self.options.run_timeout,
                    tables_every=self.options.tpu_tables_every)
            self._traces[key] = trace
            self.ran.append((name, float(trace.meta.seconds or 0.0)))
            if (self.save_golden is not None and trace.error is None
                    and name in self._references(case)):
                from verify.golden import stage_golden

                stage_golden(self.staged_goldens, case, implementation, trace, steps)
            if self.keep_traces:   # staged; replaces the kept traces with this run's report
                if case.name not in self._kept_cases:
                    judged = self.pairs() if self.kept_pairs is None else self.kept_pairs
                    keep_case(self.staged_traces, case,
                              [spec for spec in judged if spec.case == case.name])
                    self._kept_cases.add(case.name)
                keep_trace(self.staged_traces, case.name, trace)
        return self._traces[key]

    def _judged(self, case: Case) -> list[PairSpec]:
        judged = self.pairs() if self.kept_pairs is None else self.kept_pairs
        return [spec for spec in judged if spec.case == case.name]

    def _candidates(self, case: Case) -> set[str]:
        """The candidates of the pairs this session judges (with --golden, only they run)."""
        from verify.sensitivity import base_candidate

        names = set()
        for spec in self._judged(case):
            names |= {spec.candidate, base_candidate(spec.candidate)}
        return names

    def _references(self, case: Case) -> set[str]:
        return {spec.reference for spec in self._judged(case)}

    def _run_elsewhere(self, case: Case, implementation) -> Trace:
        """Run an implementation in the worker of its environment; its trace must come from
        the same data as this process's case."""
        from verify.core.runner import RunSpec
        from verify.environments.pool import WorkerPool

        if self._pool is None:
            self._pool = WorkerPool(self.environments, self.sources)
        options = self.options
        spec = RunSpec(sources=self.sources, case=case.name, implementation=implementation.name,
                       steps=options.steps, device=options.device, tpu_name=options.tpu_name,
                       full=options.full,
                       data_dir=str(options.data_dir) if options.data_dir else None,
                       replicas=tuple(options.replicas),
                       tpu_tables_every=options.tpu_tables_every)
        trace = self._pool.run(spec, implementation.environment, timeout=options.run_timeout)
        theirs = trace.meta.data_digest
        if trace.error is None and theirs != case.data_digest():
            trace.error = (f"DataMismatch: the {implementation.environment} worker built case "
                           f"{case.name} from other data or initial values (digest {theirs}, "
                           f"here {case.data_digest()}): the case's data must not depend on the "
                           f"environment (numpy or TensorFlow versions)")
        return trace

    def close(self) -> None:
        """Stop the worker processes this session started."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None

    def check(self, spec: PairSpec, test_id: str | None = None) -> PairResult:
        """Run (or reuse) the pair's traces, judge it, persist the result (as `test_id`, the
        test the run selected; the pair's id by default) and return it.

        A harness error still persists a failing record for the pair before it propagates;
        a case source that did not load persists its error as the pair's failing record.
        """
        started, self.ran = time.perf_counter(), []
        test_id = test_id or spec.id
        record = PairRecord(spec.case, spec.reference, spec.candidate, spec.replicas,
                            role=spec.role or ("control" if spec.control else "faithful"))
        if spec.candidate == IMPORT and spec.case in self.broken:
            result = PairResult.failed(replace(record, message=self.broken[spec.case]))
            write_part(self.parts_dir, test_id, result)
            self._note_progress(spec, FAIL, started)
            return result
        try:
            self._probe_tpu()
        except Exception as e:
            self._persist_harness_error(spec, test_id, record, e, started)
            raise
        if self._tpu_error:   # nothing can run: every pair fails with the resolver's reason
            result = PairResult.failed(replace(record, message=self._tpu_error))
            write_part(self.parts_dir, test_id, result)
            self._note_progress(spec, FAIL, started)
            return result
        try:
            case = self.cases()[spec.case]
            if is_mutant(spec.candidate):   # what it learns from its candidate's faithful run
                implementation, spec = resolve(case.implementation(spec.candidate), spec,
                                               self.trace(case, base_candidate(spec.candidate)))
                self._resolved[(case.name, spec.candidate)] = implementation
            result = judge_pair(spec, lambda name: self.trace(case, name), case.tolerances,
                                oracle_rows=self._oracle_rows.setdefault(case.name, {}),
                                calibration=case.calibration)
        except Exception as e:
            self._persist_harness_error(spec, test_id, record, e, started)
            raise
        write_part(self.parts_dir, test_id, result)
        self._note_progress(spec, result.verdict.status, started)
        return result

    def _persist_harness_error(self, spec: PairSpec, test_id: str, record: PairRecord,
                               error: Exception, started: float) -> None:
        """Persist a pair whose judging raised as a failing record, before the error goes on."""
        message = f"harness error: {type(error).__name__}: {error}"
        write_part(self.parts_dir, test_id, PairResult.failed(replace(record, message=message)))
        self._note_progress(spec, FAIL, started)

    def record_nothing_selected(self, no_pairs: NoPairs, test_id: str) -> None:
        """Persist why the selection held no pair: the run's report says so."""
        write_nothing_selected(self.parts_dir, test_id, no_pairs.why)
        self.progress[no_pairs.id] = {"pair": "no pair selected", "verdict": "NO RESULTS",
                                      "seconds": 0.0, "ran": []}

    def _probe_tpu(self) -> None:
        if self.options.device == "tpu" and self._tpu_error is None:
            from verify.runners.capture.devices import TpuUnavailable, resolve_tpu

            try:
                resolve_tpu(self.options.tpu_name)
            except TpuUnavailable as e:
                self._tpu_error = str(e)

    def _note_progress(self, spec: PairSpec, verdict: str, started: float) -> None:
        self.progress[spec.id] = {"pair": f"{spec.case}: {spec.reference} -> {spec.candidate}",
                                  "verdict": verdict,
                                  "seconds": round(time.perf_counter() - started, 3),
                                  "ran": list(self.ran)}

    # ---- report ----
    def options_record(self) -> dict:
        """The options that shape the numbers, as recorded in summaries and run records."""
        return {"device": self.options.device, "steps": self.options.steps or "case default",
                "replicas": ",".join(map(str, self.options.replicas)), "full": self.options.full,
                "cases": ",".join(self.case_names) if self.case_names else "all",
                "sensitivity": self.options.sensitivity}

    def collect(self) -> RunResults | None:
        """This run's results: the persisted parts, the selected tests that left none, and
        why the run stopped; None when no parity test was part of this session."""
        has_parts = self.parts_dir.is_dir()
        if not (has_parts or self.lost or self.selected or self.nothing_selected):
            return None
        results = read_parts(self.parts_dir) if has_parts else RunResults.empty()
        judged = judged_tests(self.parts_dir) if has_parts else set()
        cause = self.stopped or self.halted
        why = f"not run: {cause}" if cause else "not run: the test never reached its check"
        results.options, results.lost = self.options_record(), dict(self.lost)
        results.not_run = {t: why for t in self.selected if t not in judged and t not in self.lost}
        # A stop counts when it cut the run short, or when the selection is not known whole.
        cut_short = bool(results.not_run or results.lost) or not self.collected
        results.stopped = self.stopped if cut_short else ""
        results.nothing_selected = results.nothing_selected or self.nothing_selected
        return results

    def write_report(self, final: bool = True) -> list[Path]:
        """Merge the parts into the report, add the run record to the history, compare it;
        then (`final`) replace the kept traces, store goldens and remove the parts of earlier
        runs. A report that is not final (written at once when the run is interrupted) leaves
        those to the final one."""
        results = self.collect()
        if results is None:
            return []   # no parity test ran in this session: leave any earlier report alone
        known = results.pairs.dropna(subset=["seed"])
        seeds = {str(c): int(s) for c, s in zip(known["case"], known["seed"])}
        record = run_record(results, run_id=self.run_id,
                            provenance={"git_commit": git_commit(self.root or self.report_dir),
                                        "seeds": seeds, "keep_traces": self.keep_traces,
                                        "run_timeout": self.options.run_timeout})
        self._compare(record)
        # the history record first: a run killed right after its report appears still has it
        history = [] if self.history_dir is None else [write_record(self.history_dir, record)]
        written = write_report(self.report_dir, results, record, self.comparison)
        record_report_files(self.report_dir, written)
        written += history
        if not final:
            return written
        if self.keep_traces and self.staged_traces.is_dir() and not results.complete:
            mark_unfinished(self.staged_traces, _judged_keys(results),
                            results.stopped or self.halted or "stopped early")
        self._replace_kept_traces()
        if self.save_golden is not None:
            from verify.golden import publish_goldens

            published = publish_goldens(self.staged_goldens, self.save_golden)
            self.notes.append(f"parity: golden references of {len(published)} case(s) stored "
                              f"in {self.save_golden}")
        self._remove_earlier_parts()
        self.results = results
        return written

    def _compare(self, record: dict) -> None:
        if self.compare_to is None:
            return
        if self.previous is None:
            self.notes.append(f"parity: --compare-to {self.compare_to} holds no earlier run "
                              f"yet; nothing to compare with")
            return
        try:
            self.comparison = compare_runs(record, self.previous, self.factor)
        except Exception as e:  # noqa: BLE001 - a bad baseline must not lose this run's report
            self.notes.append(f"parity: could not compare with --compare-to {self.compare_to}"
                              f" ({type(e).__name__}: {e}); the report is written without it")
            return
        self.comparison.changes += [f"skipped a damaged history record: {skipped}"
                                    for skipped in self.skipped_records]
        record["compared_to"] = {"run_id": self.previous.get("run_id"),
                                 "regressions": self.comparison.regressions,
                                 "changes": self.comparison.changes}

    def _replace_kept_traces(self) -> None:
        """The kept traces are this report's: this run's when it kept some, none when it was
        not asked to keep them; an earlier run's stay only while this run kept nothing. Only a
        traces directory the suite wrote is replaced or removed (`suite_traces`)."""
        ours = self.traces_dir.exists() and suite_traces(self.traces_dir)
        foreign = (self.traces_dir.exists() or self.traces_dir.is_symlink()) and not ours
        if self.keep_traces and self.staged_traces.is_dir():
            if foreign:
                self.notes.append(f"parity: {self.traces_dir} is not a traces directory the "
                                  f"suite wrote, so it is left as it is; this run's traces are "
                                  f"in {self.staged_traces} until the next run")
                return
            replaced = self.report_dir / f".{TRACES_DIR}-replaced-{self.run_id}"
            if ours:
                self.traces_dir.rename(replaced)
            self.staged_traces.rename(self.traces_dir)
            shutil.rmtree(replaced, ignore_errors=True)
        elif not self.keep_traces and ours:
            shutil.rmtree(self.traces_dir, ignore_errors=True)   # an earlier report's

    def _remove_earlier_parts(self) -> None:
        """Remove the parts of earlier runs: only run directories the suite names (never a
        link, never inside a `parts` that links out of the report directory), and never those
        of a run still alive."""
        parts = self.parts_dir.parent
        if parts.is_symlink() or not parts.is_dir():
            return
        for old in parts.iterdir():
            found = RUN_DIR.match(old.name)
            if found is None or old.is_symlink() or not old.is_dir():
                continue
            if old.name == self.run_id:
                continue
            if not pid_alive(int(found.group(1))):
                shutil.rmtree(old, ignore_errors=True)


def _judged_keys(results: RunResults) -> set[tuple[str, str, str]]:
    """(case, reference, candidate) of every pair the results judged."""
    pairs = results.pairs
    if pairs.empty:
        return set()
    return set(zip(pairs["case"].astype(str), pairs["reference"].astype(str),
                   pairs["candidate"].astype(str)))

