"""The traces of one parity session's process: each implementation run at most once.

A trace is run here, in the worker process of the implementation's environment
(`verify.environments.pool`), or read from a golden reference (`--golden`: every implementation
that is no judged pair's candidate); on a TPU that cannot be reached it is a failed trace saying
why. As each trace is made it is staged as a golden reference (`--save-golden`: the references
of the judged pairs) and as a kept trace (`--keep-traces`), for the end of the session to
publish (`verify.session.session_end`).

Under pytest-xdist each worker process has its own cache, so a trace several pairs need (a
case's reference, the faithful run its mutants start from) would run once per worker. With
`shared` set (a directory all the session's workers see) such a trace runs once per session:
the first worker to need it runs it under a file lock and writes it there; a worker that
needs it meanwhile waits on the lock and reads the file (`SharedTraces`); such a wait is
listed in `waited`, so a pair's progress line says what its seconds were spent waiting for.

>>> cache = TraceSupply(SuiteOptions(), judged=lambda: [], notes=[])
>>> cache.ran, cache.waited, cache.tpu_error
([], [], None)
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Mapping

from verify.core.case import Case, PairSpec, SuiteOptions
from verify.core.meta import Environment, current_environment
from verify.core.runner import RunSpec
from verify.core.trace import Trace, trace_files
from verify.store.golden import golden_trace, stage_golden
from verify.store.kept_traces import file_stem, keep_case, keep_trace
from verify.core.sensitivity import base_candidate, resolve


class TraceSupply:
    """Runs implementations, each at most once per process, and keeps their traces.

    `judged` gives the pairs the session judges (with --golden only their candidates run; a
    kept case.json lists exactly them); `notes` is the session's list of notes for the reader.
    `ran` lists the (implementation, seconds) run since the caller last emptied it, `waited`
    the (implementation, seconds) waited for while another process of the session ran it.
    """

    def __init__(self, options: SuiteOptions, *, judged: Callable[[], list[PairSpec]],
                 notes: list[str], environments: dict | None = None,
                 sources: tuple[str, ...] = (), golden: Path | None = None,
                 save_golden: Path | None = None, staged_goldens: Path | None = None,
                 keep_traces: bool = False, staged_traces: Path | None = None,
                 shared: Path | None = None):
        self.options, self._judged_pairs, self.notes = options, judged, notes
        self.environments, self.sources = dict(environments or {}), tuple(sources)
        self.golden, self.save_golden, self.staged_goldens = golden, save_golden, staged_goldens
        self.keep_traces, self.staged_traces = keep_traces, staged_traces
        self._pool = None
        self.shared = SharedTraces(shared) if shared is not None else None
        self._traces: dict[tuple[str, str], Trace] = {}
        self._kept_cases: set[str] = set()
        self._resolved: dict[tuple[str, str], object] = {}   # mutants completed at run time
        self.tpu_error: str | None = None
        self._tpu_probed = False
        self.ran: list[tuple[str, float]] = []   # (implementation, seconds) run by a check
        self.waited: list[tuple[str, float]] = []   # ... waited for, another process running it
        self._use_counts: Counter | None = None

    def trace(self, case: Case, name: str) -> Trace:
        """The trace of implementation `name`, run once per process."""
        key = (case.name, name)
        if key not in self._traces:
            implementation = self.implementation(case, name)
            steps = self.options.steps or case.steps
            if self._from_golden(case, name):

                trace = golden_trace(self.golden, case, implementation, steps)
                recorded = trace.meta.environment.tensorflow
                here = Environment.current().tensorflow
                if trace.error is None and recorded and here and recorded != here:
                    self.notes.append(
                        f"parity: the golden of {case.name}/{name} was recorded under TF "
                        f"{recorded}; this run has TF {here}: its pairs may differ for that "
                        f"reason alone (record the goldens again with --save-golden)")
            elif self.tpu_error:
                trace = Trace(name, {"replicas": implementation.replicas,
                                     "case": case.name, "data_digest": case.data_digest()},
                              error=self.tpu_error)
            elif self._shared(case, name):
                trace, waited = self.shared.trace(case.name, name,
                                                  lambda: self._run(case, name, implementation))
                if waited:
                    self.waited.append((name, waited))
            else:
                trace = self._run(case, name, implementation)
            self._traces[key] = trace
            self._stage(case, name, implementation, trace, steps)
        return self._traces[key]

    def prepare(self, case: Case, names) -> None:
        """Make the traces of `names` ready, those another process is running last: a pair's
        candidate runs here while its reference runs in another xdist worker, instead of this
        worker waiting for the reference first."""
        later = [name for name in names if (case.name, name) not in self._traces
                 and self._shared(case, name) and self.shared.busy(case.name, name)]
        for name in [*(n for n in names if n not in later), *later]:
            self.trace(case, name)

    def _shared(self, case: Case, name: str) -> bool:
        """Whether the trace of `name` is shared with the session's other processes."""
        return self.shared is not None and self._uses(case, name) > 1

    def _run(self, case: Case, name: str, implementation) -> Trace:
        """Run `implementation` (as `name`) here or in its environment's worker; noted in
        `ran`."""
        from verify.runners.run import run_implementation

        if implementation.environment != current_environment():
            trace = self._run_elsewhere(case, implementation)
        else:
            trace = run_implementation(
                case, implementation, steps=self.options.steps,
                device=self.options.device, tpu_name=self.options.tpu_name,
                timeout=self.options.run_timeout, tables_every=self.options.tpu_tables_every)
        self.ran.append((name, float(trace.meta.seconds or 0.0)))
        return trace

    def _uses(self, case: Case, name: str) -> int:
        """How many of the judged pairs of `case` need the trace of `name` (as a side, or as
        the faithful run a mutant starts from)."""
        if self._use_counts is None:
            counts: Counter = Counter()
            for spec in self._judged_pairs():
                sides = {spec.reference, spec.candidate, base_candidate(spec.candidate)}
                counts.update((spec.case, side) for side in sides)
            self._use_counts = counts
        return self._use_counts[(case.name, name)]

    def _stage(self, case: Case, name: str, implementation, trace: Trace, steps: int) -> None:
        """Stage a new trace as a golden reference and as a kept trace, as the options ask."""
        if (self.save_golden is not None and trace.error is None
                and name in self._references(case)):

            stage_golden(self.staged_goldens, case, implementation, trace, steps)
        if self.keep_traces:   # staged; replaces the kept traces with this run's report
            if case.name not in self._kept_cases:
                keep_case(self.staged_traces, case, self._judged(case))
                self._kept_cases.add(case.name)
            keep_trace(self.staged_traces, case.name, trace)

    def resolve_mutant(self, case: Case, spec: PairSpec) -> PairSpec:
        """Complete a mutant pair with what it learns from its candidate's faithful run; its
        implementation is then the one `trace` runs under the mutant's name."""
        implementation, spec = resolve(case.implementation(spec.candidate), spec,
                                       self.trace(case, base_candidate(spec.candidate)))
        self._resolved[(case.name, spec.candidate)] = implementation
        return spec

    def implementation(self, case: Case, name: str):
        """The implementation `trace` runs under `name` (a mutant as completed by its pair)."""
        return self._resolved.get((case.name, name)) or case.implementation(name)

    def _judged(self, case: Case) -> list[PairSpec]:
        return [spec for spec in self._judged_pairs() if spec.case == case.name]

    def _candidates(self, case: Case) -> set[str]:
        """The candidates of the pairs this session judges (with --golden, only they run)."""
        names = set()
        for spec in self._judged(case):
            names |= {spec.candidate, base_candidate(spec.candidate)}
        return names

    def _from_golden(self, case: Case, name: str) -> bool:
        """Whether `name`'s trace is read from the golden references (with --golden, every
        implementation that is no judged pair's candidate) rather than run."""
        return self.golden is not None and name not in self._candidates(case)

    def _references(self, case: Case) -> set[str]:
        return {spec.reference for spec in self._judged(case)}

    def _run_elsewhere(self, case: Case, implementation) -> Trace:
        """Run an implementation in the worker of its environment; its trace must come from
        the same data as this process's case."""
        from verify.environments.pool import EnvironmentPool

        if self._pool is None:
            self._pool = EnvironmentPool(self.environments, self.sources,
                                    device=self.options.device)
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

    def probe_tpu(self, cases: Mapping[str, Case] | None = None) -> None:
        """On a TPU session, once: resolve the TPU; when it cannot be reached, `tpu_error` says
        why (and every trace fails with it).

        On a TPU VM one process at a time may hold the TPU (libtpu's lock), and this process
        keeps it once it has resolved it. So when implementations of the judged pairs in
        `cases` run in other environments' workers, the TPU is first probed from a child
        process, those implementations run (each worker holding the TPU in turn, see
        `EnvironmentPool.hand_tpu_to`), their workers stop, and only then does this process take the
        TPU for its own runs."""
        if self.options.device != "tpu" or self._tpu_probed:
            return
        self._tpu_probed = True
        from verify.runners.capture.devices import (TpuUnavailable, probe_tpu_in_child,
                                                    resolve_tpu)

        elsewhere = self._tpu_runs_elsewhere(cases or {})
        if elsewhere:
            self.tpu_error = probe_tpu_in_child(self.options.tpu_name)
            if self.tpu_error:
                return
            try:
                for case, name in elsewhere:
                    self.trace(case, name)   # a failing run is a failing trace, kept
            finally:
                if self._pool is not None:
                    self._pool.hand_tpu_to(None)
        try:
            resolve_tpu(self.options.tpu_name)
        except TpuUnavailable as e:
            self.tpu_error = str(e)

    def _tpu_runs_elsewhere(self, cases: Mapping[str, Case]) -> list[tuple[Case, str]]:
        """(case, implementation) of the judged pairs that run in another environment's
        worker in this session (a golden reference does not run), each once."""
        found: dict[tuple[str, str], tuple[Case, str]] = {}
        for spec in self._judged_pairs():
            case = cases.get(spec.case)
            for name in (spec.reference, spec.candidate) if case is not None else ():
                try:
                    implementation = case.implementation(name)
                except (KeyError, ValueError):   # a mutant: it runs here
                    continue
                if self._from_golden(case, name):
                    continue
                if implementation.environment != current_environment():
                    found.setdefault((case.name, name), (case, name))
        return list(found.values())

    def close(self) -> None:
        """Stop the worker processes this cache started."""
        if self._pool is not None:
            self._pool.close()
            self._pool = None


class SharedTraces:
    """Traces run once per session and read by every process of it, in `directory`.

    `trace(case, name, run)` returns the trace stored under (case, name), running `run()` and
    storing its result first when none is there, and the seconds it waited for another process
    (0.0 when it did not). An exclusive `flock` per trace is held while it runs, so a second
    process asking meanwhile waits and then reads it; a process that dies
    while running one releases the lock with it and the next asker runs it again. A failed
    run's trace is stored too: it failed for this session, as the cache of one process would
    keep it.

    >>> import tempfile
    >>> shared = SharedTraces(Path(tempfile.mkdtemp()))
    >>> trace, waited = shared.trace("c", "tf1", lambda: Trace("tf1", {"replicas": 1}))
    >>> trace.implementation, waited
    ('tf1', 0.0)
    >>> shared.trace("c", "tf1", lambda: 1 / 0)[0].meta.replicas   # read, not run again
    1
    """

    def __init__(self, directory: Path):
        self.directory = Path(directory)

    def path(self, case: str, name: str) -> Path:
        """Where the trace of (case, name) is stored (without its .json/.npz suffix)."""
        digest = hashlib.sha256(f"{case}\0{name}".encode()).hexdigest()[:10]
        return self.directory / f"{file_stem(case)}.{file_stem(name)}-{digest}"

    def busy(self, case: str, name: str) -> bool:
        """Whether another process is running the trace of (case, name) now."""
        stem = self.path(case, name)
        try:
            fd = os.open(f"{stem}.lock", os.O_RDWR)
        except FileNotFoundError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    def trace(self, case: str, name: str, run: Callable[[], Trace]) -> tuple[Trace, float]:
        """The trace of (case, name), read when stored, else `run()` and stored; and the
        seconds spent waiting while another process ran it."""
        stem = self.path(case, name)
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(f"{stem}.lock", os.O_CREAT | os.O_RDWR, 0o644)
        waited = 0.0
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:   # another process runs it: wait for it
                started = time.perf_counter()
                fcntl.flock(fd, fcntl.LOCK_EX)
                waited = time.perf_counter() - started
            json_path, _ = trace_files(stem)
            if json_path.is_file():
                return Trace.load(json_path), waited
            trace = run()
            try:
                trace.save(stem, compress=False)   # the .json last: only whole traces count
            except Exception:  # noqa: BLE001 - unshared, every process that needs it runs it
                pass
            return trace, waited
        finally:
            os.close(fd)   # releases the lock
