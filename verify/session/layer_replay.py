"""Where inside the step: a replay of a pair's first divergent step, layer by layer.

A pair that first diverges at step k in its loss or its gradients says which value of which
variable went wrong, not which layer of the forward pass made it so. `LayerReplay` runs both
sides again for k steps (each in this process, from fresh TensorFlow state, as every run) with
their layers observed at step k (`verify.runners.capture.layer_taps`), and compares them layer
by layer (`verify.judge.layers`). Step 1 starts from the case's initial values on both sides,
so its replay is teacher-forced exactly; a later step starts from each side's own state after
step k-1, which agreed within tolerance (k is the first divergent step) but is not the
reference's to the bit.

The replay is inert: it never touches the pair's traces or its verdict, only adds the first
divergent layer and the per-layer rows to the pair's record; each replayed run's losses up to
step k are checked against the run the pair was judged on, and the record says whether they
are bitwise equal. It runs for pairs that first diverge in `loss` or `grad`, sensitivity
mutants excepted (`--replay-layers diverging`, the default), for every pair (`all`: step 1 for
a pair that does not diverge), or never (`off`). A side is replayed once per process and step.

>>> from verify.core.case import SuiteOptions
>>> from verify.judge.records import PairRecord
>>> replay = LayerReplay(SuiteOptions(), trace_supply=None)
>>> spec = PairSpec("c", "tf1", "tf2")
>>> replay.step_of(spec, PairRecord("c", "tf1", "tf2", 1, first_step=3, first_quantity="grad"))
3
>>> replay.step_of(spec, PairRecord("c", "tf1", "tf2", 1, first_step=1, first_quantity="slot"))
"""
from __future__ import annotations

import math
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from verify.core.case import Case, PairSpec, SuiteOptions
from verify.core.layer_capture import LayerCapture, LayerRecorder
from verify.core.meta import current_environment
from verify.core.names import NameMapError
from verify.judge.layers import compare_layers, layer_rows, unobserved_lines
from verify.judge.pair import PairResult
from verify.core.sensitivity import is_mutant
from verify.explain.repro import repro_directory
from verify.session.substitution import substitute
from verify.session.substitution_values import Outcome, Side
from verify.session.update_substitution import WHERE, substitute_update

if TYPE_CHECKING:
    from verify.session.trace_supply import TraceSupply

MODES = ("diverging", "all", "off")
REPLAYED = ("loss", "grad")   # first divergences a layer replay can localise


class LayerReplay:
    """Replays pairs' first divergent steps layer by layer (see the module's docstring)."""

    def __init__(self, options: SuiteOptions, trace_supply: "TraceSupply",
                 report_dir: Path | None = None):
        self.options, self.trace_supply, self.report_dir = options, trace_supply, report_dir
        self.mode = getattr(options, "replay_layers", "diverging")
        if self.mode not in MODES:
            raise ValueError(f"--replay-layers is one of {', '.join(MODES)}, got {self.mode!r}")
        self._captures: dict[tuple[str, str, int], tuple[LayerCapture | None, str]] = {}

    def step_of(self, spec: PairSpec, record) -> int | None:
        """The step to replay for a judged pair, or None when it is not replayed."""
        if self.mode == "off":
            return None
        diverging = record.first_quantity in REPLAYED and record.first_step is not None and \
            not (isinstance(record.first_step, float) and math.isnan(record.first_step))
        if self.mode == "all":
            return int(record.first_step) if diverging else 1
        if not diverging or is_mutant(spec.candidate) or spec.role == "mutant":
            return None
        return int(record.first_step)

    def apply(self, case: Case, spec: PairSpec, result: PairResult) -> PairResult:
        """`result` with the replay's first divergent layer, rows and note added (unchanged
        when the pair is not replayed). A replay that raises leaves the pair's verdict as it
        was judged, its record saying why there is no layer."""
        step = self.step_of(spec, result.record)
        if step is None:
            return self._update_substituted(case, spec, result)
        try:
            return self._replayed(case, spec, result, step)
        except Exception as e:  # noqa: BLE001 - the verdict stands; the replay says it failed
            result.record = replace(result.record, layer_replay=(
                f"step {step} not replayed layer by layer: the replay raised "
                f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"))
            return result

    def _replayed(self, case: Case, spec: PairSpec, result: PairResult,
                  step: int) -> PairResult:
        started = time.perf_counter()
        captures, notes, problems = {}, [], []
        for name in dict.fromkeys((spec.reference, spec.candidate)):
            capture, note = self._capture(case, name, step)
            if capture is None:
                problems.append(f"{name}: {note}")
            else:
                captures[name], notes = capture, notes + [note]
        seconds = time.perf_counter() - started
        if problems:
            result.record = replace(result.record, layer_replay=(
                f"step {step} not replayed layer by layer: " + "; ".join(problems)))
            return result
        reference, candidate = captures[spec.reference], captures[spec.candidate]
        at_step = result.rows[result.rows["step"] == step]
        comparison = compare_layers(reference, candidate, loss_differs=_failed(at_step, "loss"),
                                    grads_differ=_failed(at_step, "grad"))
        result.layers = layer_rows(comparison, spec.case, spec.reference, spec.candidate,
                                   spec.replicas, step)
        compared = int((comparison.rows["status"].isin(("passed", "failed"))).sum())
        note = "; ".join([f"step {step} replayed layer by layer: {compared} values compared "
                          f"({seconds:.1f} s in all)", *dict.fromkeys(notes),
                          *unobserved_lines((spec.reference, reference),
                                            (spec.candidate, candidate))])
        result.record = replace(result.record, first_layer=comparison.first or (
            f"none: every layer of step {step} agrees"), first_layer_drift=comparison.first_drift,
            layer_replay=note)
        return self._substituted(case, spec, result, comparison, captures, step)

    def _substituted(self, case: Case, spec: PairSpec, result: PairResult, comparison,
                     captures: dict, step: int) -> PairResult:
        """`result` with the substitution of its first divergent layer (`substitution`, and
        the likely cause extended) and the repro written for a layer found local."""
        sides = [Side(name, captures[name], self.trace_supply.implementation(case, name).names,
                      self.trace_supply.implementation(case, name).environment)
                 for name in (spec.reference, spec.candidate)]
        try:
            outcome = substitute(comparison, *sides,
                                 self.trace_supply.trace(case, spec.reference), step,
                                 self._repro_dir(spec),
                                 self.trace_supply.trace(case, spec.candidate))
        except Exception as e:  # noqa: BLE001 - the replay and the verdict stand
            outcome = Outcome(f"substitution at step {step} raised {type(e).__name__}: "
                              f"{str(e).splitlines()[0] if str(e) else ''}")
        return self._with_outcome(result, outcome)

    def _update_substituted(self, case: Case, spec: PairSpec, result: PairResult) -> PairResult:
        """`result` with its optimizer update substituted, for a pair (not a mutant) that first
        diverges in its weights or slots (`verify.session.update_substitution`); one that
        first diverges in its input is local to the input pipeline (nothing is substituted)."""
        record = result.record
        if self.mode == "off" or is_mutant(spec.candidate) or spec.role == "mutant":
            return result
        if record.first_quantity == "input":   # before any layer: nothing to substitute
            return self._with_outcome(result, Outcome(
                f"substitution at step {int(record.first_step)}: the batch differs before any "
                f"layer runs ({record.first_tensor}): local to the input pipeline; what the "
                f"layers compute from it is carried in (not substituted)"))
        if record.first_quantity not in WHERE:
            return result
        step = int(record.first_step)
        if self.options.device != "cpu":
            return self._with_outcome(result, Outcome(
                f"optimizer-update substitution at step {step}: not run: the sides ran on "
                f"{self.options.device}, whose update (an embedding engine's included) a "
                f"rebuilt optimizer on the CPU does not stand for"))
        try:
            outcome = substitute_update(
                self.trace_supply.trace(case, spec.reference),
                self.trace_supply.trace(case, spec.candidate), step,
                tuple(self.trace_supply.implementation(case, name).environment
                      for name in (spec.reference, spec.candidate)), self._repro_dir(spec))
        except Exception as e:  # noqa: BLE001 - the verdict stands
            outcome = Outcome(f"optimizer-update substitution at step {step} raised "
                              f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        return self._with_outcome(result, outcome)

    def _repro_dir(self, spec: PairSpec) -> Path | None:
        return None if self.report_dir is None else repro_directory(
            self.report_dir, spec.case, spec.reference, spec.candidate)

    def _with_outcome(self, result: PairResult, outcome: Outcome) -> PairResult:
        """`result` with a substitution's sentence (added to the likely cause) and repro."""
        if not outcome.sentence:
            return result
        record = result.record
        repro = "" if not outcome.repro or self.report_dir is None else \
            str(Path(outcome.repro).relative_to(self.report_dir))
        cause = outcome.sentence + (f" (repro: {repro})" if repro else "")
        if outcome.conclusive:   # the likely cause gains what a substitution concluded
            record = replace(record, likely_cause=f"{record.likely_cause}; {cause}"
                             if record.likely_cause else cause)
        result.record = replace(record, substitution=outcome.sentence, repro=repro)
        return result

    def _capture(self, case: Case, name: str, step: int) -> tuple[LayerCapture | None, str]:
        """Side `name`'s replayed step, or None and why there is none; run once per process."""
        key = (case.name, name, step)
        if key not in self._captures:
            self._captures[key] = self._replay(case, name, step)
        return self._captures[key]

    def _replay(self, case: Case, name: str, step: int) -> tuple[LayerCapture | None, str]:
        from verify.runners.run import run_implementation

        implementation = self.trace_supply.implementation(case, name)
        if self.options.device != "cpu":
            return None, (f"a layer replay runs on CPU only (this session runs on "
                          f"{self.options.device})")
        if implementation.environment != current_environment():
            return None, (f"runs in environment {implementation.environment!r}; a layer "
                          f"replay runs in the suite's own environment only")
        recorder = LayerRecorder(step)
        trace = run_implementation(case, implementation, steps=step,
                                   timeout=self.options.run_timeout, layers=recorder)
        if trace.error:
            return None, f"its replay run failed: {trace.error.splitlines()[0]}"
        try:
            capture = recorder.capture(implementation.names)
        except (RuntimeError, NameMapError, ValueError) as e:
            return None, str(e)
        return capture, _inert_note(name, trace, self.trace_supply.trace(case, name), step)


def _failed(rows, quantity: str) -> bool:
    chosen = rows[rows["quantity"] == quantity]
    return bool((~chosen["passed"].astype(bool)).any())


def _inert_note(name: str, replayed, judged, step: int) -> str:
    """Whether the replayed run's losses up to `step` equal, to the bit, those of the run the
    pair was judged on (the layer taps change no number)."""
    differing = [k for k in range(1, step + 1)
                 if not _same(replayed.get(k, "loss", "loss"), judged.get(k, "loss", "loss"))]
    took = f"{name} replayed in {replayed.meta.seconds or 0:.1f} s"
    if not differing:
        return f"{took}, reproducing its losses to the bit"
    return (f"{took}, NOT reproducing its loss at step {differing[0]} to the bit "
            f"(the run is not deterministic here, or the replay changed it): read its layers "
            f"with care")


def _same(a, b) -> bool:
    return a is not None and b is not None and np.array_equal(np.asarray(a), np.asarray(b))
