"""One parity session: run each implementation at most once per process, judge pairs, persist
every judged pair at once, and write the report, the run record and the history at the end.

The session knows nothing of pytest: `verify.session.plugin` (pytest) and `verify.__main__` (CLI) are
thin adapters around it. Cases come from a loader, so they can live anywhere
(`verify.runners.case_sources`); a source that fails to load becomes a failing pair of its own.

The report covers exactly what the run judged: the adapter tells the session which tests it
selected and why it stopped early, and a selected test that left no part is listed as not run
(the verdict is then INCOMPLETE, never PASS).

The traces come from a `verify.session.trace_supply.TraceSupply` (each implementation run at most once
per process); `verify.session.session_end` makes the run record and readies the report directory for
the next run.

>>> options = SuiteOptions(device="tpu")   # on "cpu" it first sets up 8 logical CPU devices
>>> session = ParitySession(options, Path("/tmp/r"), "run-1", lambda broken: {})
>>> session.pairs()
[]
>>> session.selection()[0].why
'no pair selected: the case sources declare no case (a case module defines CASE, ...)'
"""
from __future__ import annotations

import dataclasses
import shutil
import time
from dataclasses import replace
from pathlib import Path
from typing import Callable, ClassVar

from verify.runners.case_sources import CaseSourceError
from verify.core.case import Case, PairSpec, SuiteOptions
from verify.core.pair_spec import shard_of
from verify.core.trace import Trace
from verify.store.golden import publish_goldens
from verify.store.history import DEFAULT_FACTOR, RunComparison, compare_runs, write_record
from verify.explain import explain_pair
from verify.judge import PairRecord, PairResult, judge_pair
from verify.judge.verdict import FAIL
from verify.store.kept_traces import TRACES_DIR, mark_unfinished
from verify.session.layer_replay import LayerReplay
from verify.render import write_report
from verify.store.report_dir import record_report_files
from verify.store.results import (RunResults, judged_tests, read_parts, write_nothing_selected,
                            write_part)
from verify.core.sensitivity import KINDS, is_mutant, with_mutants
from verify.session.session_end import (judged_keys, remove_earlier_parts, remove_own_parts,
                                replace_kept_traces, run_options, session_record)
from verify.session.trace_supply import TraceSupply

# --sensitivity on a case that lists no kinds: every kind but epsilon (not every optimizer
# has one; a case lists it where its optimizers do)
DEFAULT_KINDS = tuple(k for k in KINDS if k != "epsilon")

# Loads every case by name, putting each source that fails to load into the dict it is given
# (module name -> error) instead of raising.
CaseLoader = Callable[[dict[str, str]], dict[str, Case]]
SOURCE, IMPORT = "(source)", "(import)"   # the pair standing for a source that failed to load
SHARED_DIR = "shared-traces"   # under the run's parts: traces the session's workers share


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
                 save_golden: Path | None = None, selection: dict | None = None,
                 share_traces: bool = False):
        self.options, self.report_dir, self.run_id = options, report_dir, run_id
        self.case_names, self._load_cases = case_names, load_cases
        self.selection_options = dict(selection or {})   # -k, -m, case sources (run record)
        self.parts_dir = report_dir / "parts" / run_id
        self.traces_dir = report_dir / TRACES_DIR
        self.staged_traces = self.parts_dir / TRACES_DIR   # this run's, until its report
        # share_traces (several xdist workers): a trace several pairs need runs once per
        # session, written here by the first worker that needs it (TraceSupply)
        self.shared_traces = self.parts_dir / SHARED_DIR if share_traces else None
        self.keep_traces, self.history_dir, self.root = keep_traces, history_dir, root
        # Implementations in other environments run in worker processes of those environments
        # (verify.environments.pool), asked by case sources and names.
        self.environments, self.sources = dict(environments or {}), tuple(sources)
        # --golden: implementations that are no selected pair's candidate are read from there;
        # --save-golden: the references this run judges against are stored there at the end.
        self.golden, self.save_golden = golden, save_golden
        self.staged_goldens = self.parts_dir / "golden"
        self.previous: dict | None = None      # --compare-to's run record
        self.skipped_records: list[str] = []   # damaged history records it was chosen past
        self.compare_to: Path | None = None
        self.factor = DEFAULT_FACTOR
        self._cases: dict[str, Case] | None = None
        self._oracle_rows: dict[str, dict] = {}   # case -> (oracle vs implementation) rows
        # The pairs this session judges, when fewer than `pairs()` (pytest's -k): set by the
        # adapter once it knows them, so a kept case.json lists exactly the pairs kept.
        self.kept_pairs: list[PairSpec] | None = None
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
        # each implementation's trace, run at most once (or read from --golden) and staged
        self.trace_supply = TraceSupply(options, judged=self._judged_pairs, notes=self.notes,
                                      environments=self.environments, sources=self.sources,
                                      golden=golden, save_golden=save_golden,
                                      staged_goldens=self.staged_goldens,
                                      keep_traces=keep_traces, staged_traces=self.staged_traces,
                                      shared=self.shared_traces)
        self.layer_replay = LayerReplay(options, self.trace_supply, report_dir)

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
        if self.options.shard is not None:   # --shard K/N: this shard's pairs only
            shard, shards = self.options.shard
            selected = [spec for spec in selected if shard_of(spec.id, shards) == shard]
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
        if self.options.shard is not None:
            shard, shards = self.options.shard
            return (f"no pair selected: shard {shard}/{shards} holds none of the selection's "
                    f"pairs (they fall in the other shards); run fewer shards than pairs")
        scope = " ".join(f"--case {n}" for n in self.case_names or ()) or "the cases"
        known = "; ".join(f"{name}: {', '.join(map(str, c))}" for name, c in counts.items() if c)
        return (f"no pair selected: --replicas {','.join(map(str, self.options.replicas))} "
                f"matches no candidate of {scope}; candidates train on these replica counts: "
                f"{known}; pass --replicas with some of them")

    # ---- running ----
    def trace(self, case: Case, name: str) -> Trace:
        """The trace of implementation `name`, run once per process (`TraceSupply`)."""
        return self.trace_supply.trace(case, name)

    def _judged_pairs(self) -> list[PairSpec]:
        """The pairs this session judges: `kept_pairs` once the adapter set them, else all."""
        return self.pairs() if self.kept_pairs is None else self.kept_pairs

    def close(self) -> None:
        """Stop the worker processes this session started."""
        self.trace_supply.close()

    def check(self, spec: PairSpec, test_id: str | None = None) -> PairResult:
        """Run (or reuse) the pair's traces, judge it, persist the result (as `test_id`, the
        test the run selected; the pair's id by default) and return it.

        A harness error still persists a failing record for the pair before it propagates;
        a case source that did not load persists its error as the pair's failing record.
        """
        started, self.trace_supply.ran, self.trace_supply.waited = time.perf_counter(), [], []
        test_id = test_id or spec.id
        record = PairRecord(spec.case, spec.reference, spec.candidate, spec.replicas,
                            role=spec.role or ("control" if spec.control else "faithful"))
        if spec.candidate == IMPORT and spec.case in self.broken:
            result = PairResult.failed(replace(record, message=self.broken[spec.case]))
            write_part(self.parts_dir, test_id, result)
            self._note_progress(spec, FAIL, started)
            return result
        try:
            self.trace_supply.probe_tpu(self.cases())
        except Exception as e:
            self._persist_harness_error(spec, test_id, record, e, started)
            raise
        tpu_error = self.trace_supply.tpu_error
        if tpu_error:   # nothing can run: every pair fails with the resolver's reason
            result = PairResult.failed(replace(record, message=tpu_error))
            write_part(self.parts_dir, test_id, result)
            self._note_progress(spec, FAIL, started)
            return result
        try:
            case = self.cases()[spec.case]
            if is_mutant(spec.candidate):   # what it learns from its candidate's faithful run
                spec = self.trace_supply.resolve_mutant(case, spec)
            self.trace_supply.prepare(case, [spec.reference, spec.candidate])
            result = judge_pair(spec, lambda name: self.trace(case, name), case.tolerances,
                                oracle_rows=self._oracle_rows.setdefault(case.name, {}),
                                calibration=case.calibration_on(self.options.device))
            result = explain_pair(result, spec, lambda name: self.trace(case, name))
            result = self.layer_replay.apply(case, spec, result)
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
                                      "seconds": 0.0, "ran": [], "waited": []}

    def _note_progress(self, spec: PairSpec, verdict: str, started: float) -> None:
        self.progress[spec.id] = {"pair": f"{spec.case}: {spec.reference} -> {spec.candidate}",
                                  "verdict": verdict,
                                  "seconds": round(time.perf_counter() - started, 3),
                                  "ran": list(self.trace_supply.ran),
                                  "waited": list(self.trace_supply.waited)}

    # ---- report ----
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
        results.options = {**run_options(self.options, self.case_names),
                           **self.selection_options}
        results.lost = dict(self.lost)
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
        record = session_record(results, self.run_id, self.root or self.report_dir,
                                self.keep_traces, self.options.run_timeout)
        self._compare(record)
        # the history record first: a run killed right after its report appears still has it
        history = [] if self.history_dir is None else [write_record(self.history_dir, record)]
        written = write_report(self.report_dir, results, record, self.comparison)
        record_report_files(self.report_dir, written)
        written += history
        if not final:
            return written
        if self.keep_traces and self.staged_traces.is_dir() and not results.complete:
            mark_unfinished(self.staged_traces, judged_keys(results),
                            results.stopped or self.halted or "stopped early")
        note = replace_kept_traces(self.report_dir, self.staged_traces, self.run_id,
                                   self.keep_traces)
        if note:
            self.notes.append(note)
        if self.save_golden is not None:

            refused: list[str] = []
            published = publish_goldens(self.staged_goldens, self.save_golden, refused)
            self.notes += [f"parity: {why}" for why in refused]
            self.notes.append(f"parity: golden references of {len(published)} case(s) stored "
                              f"in {self.save_golden}")
        remove_earlier_parts(self.parts_dir, self.run_id)
        shutil.rmtree(self.parts_dir / SHARED_DIR, ignore_errors=True)   # the workers are done
        if not self.staged_traces.exists():   # (else the note says this run's traces are there)
            remove_own_parts(self.parts_dir)   # merged into the report: nothing left there
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
