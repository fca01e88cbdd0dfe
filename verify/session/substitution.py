"""Local or carried in: the first divergent layer of a replayed step, substituted.

After a layer replay (`verify.session.layer_replay`) names the first divergent layer, this runs
that layer and the observed layer before it once more on each side, rebuilt from their configs
(`verify.runners.capture.substitution`), on the same values: the reference's input captured at
the step (in each side's own layout, through the name maps) and the reference's weights before
the step, read from its judged trace in canonical names and put in each side's layout by the
name maps' transforms. `verify.explain.substitution` judges the outputs against the
reference's own one-ulp noise of the layer; a layer found local gets a standalone repro
(`verify.explain.repro`) under the report directory.

No pipeline runs again: the values are the replay's and the trace's; only the layers run,
a few times each. An embedding lookup (its input is ids, or a dict of features) is substituted
as its declared combiner, run by TensorFlow's own op on the reference's ids and table
(`verify.session.lookup_substitution`); other layers whose input is not one floating tensor
and per-example losses are not substituted, and the sentence says so.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from verify.core.layer_capture import LAYER_INPUT, LAYER_OUTPUT
from verify.core.trace import Trace
from verify.explain.repro import write_layer_repro
from verify.explain.substitution import Substitution, judge_substitution
from verify.judge.layers import EMBEDDING_CLASSES, LayerComparison
from verify.session.backward_substitution import substitute_backward
from verify.session.lookup_substitution import substitute_lookup
from verify.session.substitution_values import (Outcome, Side, layer_classes, native_input,
                                               weight_of)


def substitute(comparison: LayerComparison, reference: Side, candidate: Side,
               reference_trace: Trace, step: int, repro_dir: Path | None,
               candidate_trace: Trace | None = None) -> Outcome:
    """Substitute the first divergent layer of `comparison` and the layer before it (see the
    module's docstring); `repro_dir`: where a local layer's repro goes (None: nowhere);
    `candidate_trace`: whose declared combiners an embedding lookup runs."""
    forward = comparison.rows[comparison.rows["direction"] == "forward"]
    failed = forward[forward["status"] == "failed"]
    if failed.empty:   # every layer agrees forward: the gradients flowing back, if any
        return substitute_backward(comparison, reference, candidate, reference_trace, step)
    first, kind = str(failed.iloc[0]["layer"]), str(failed.iloc[0]["kind"])
    if first == "loss":
        return Outcome(f"substitution at step {step}: the first divergent value is the "
                       f"per-example loss; a loss is not substituted")
    if kind == LAYER_OUTPUT and _is_lookup(first, reference):
        return substitute_lookup(first, str(failed.iloc[0]["part"] or ""), reference, candidate,
                                 reference_trace, candidate_trace, step, repro_dir)
    order = list(dict.fromkeys(layer for layer in forward["layer"] if layer != "loss"))
    before = order[order.index(first) - 1] if order.index(first) > 0 else None
    found, runs = [], {}
    for layer in [first] + ([before] if before else []):
        substitution, runs[layer] = _substituted(layer, reference, candidate, reference_trace,
                                                 step)
        found.append(substitution)
    parts = [found[0].sentence()] + [f"the layer before, {s.sentence()}" for s in found[1:]]
    sentence = f"substitution at step {step}: " + "; ".join(parts)
    if found[0].verdict == "alike":
        sentence += "; " + _carried_in(first, kind, forward, step)
    repro = ""
    local = next((s for s in found if s.verdict == "local"), None)
    if local is not None and repro_dir is not None:
        repro = str(write_layer_repro(repro_dir, local, *runs[local.layer], step=step,
                                      sides=(reference.name, candidate.name),
                                      environment=candidate.environment))
    return Outcome(sentence, tuple(found), repro)


def _is_lookup(layer: str, reference: Side) -> bool:
    """Whether `layer` is an embedding lookup on the reference: a class of
    `EMBEDDING_CLASSES` whose input the replay did not capture as one tensor."""
    entries = [e for e in reference.capture.entries if e.layer == layer]
    return bool(entries) and not any(e.kind == LAYER_INPUT for e in entries) and any(
        name in entries[0].layer_class for name in EMBEDDING_CLASSES)


def _carried_in(layer: str, kind: str, forward, step: int) -> str:
    inputs = forward[(forward["layer"] == layer) & (forward["kind"] == "input")]
    fed_by = str(inputs.iloc[0]["fed_by"]) if not inputs.empty else ""
    if kind == "input" or (inputs["status"] == "failed").any():
        return (f"the difference at `{layer}` is carried in: its input already differs" +
                (f" (the {fed_by} feeding it, which holds no variables, or what feeds that)"
                 if fed_by else " (the input pipeline, or a layer the replay does not observe)"))
    if step == 1:   # no update before it: both sides start from the case's initial values
        return (f"the difference at `{layer}` is not explained: its input agrees and its "
                f"rebuilt layer computes alike, so either the weights it ran with at step 1 "
                f"are not the case's initial values as loaded, or the layer that ran computes "
                f"otherwise than its config rebuilds")
    return (f"the difference at `{layer}` is carried in: its input agrees, so its weights "
            f"before step {step} already differ (an earlier update, amplified)")


def _substituted(layer: str, reference: Side, candidate: Side, trace: Trace, step: int):
    """One layer substituted: the judged `Substitution`, and the reference's and the
    candidate's runs (None when it could not run)."""
    from verify.runners.capture.substitution import run_unit

    units = reference.capture.units.get(layer), candidate.capture.units.get(layer)
    observed = reference.capture.by_key()
    given, captured = observed.get((layer, "input", "")), observed.get((layer, "output", ""))
    layer_class = layer_classes(layer, reference, candidate)
    if None in units or given is None or captured is None:
        why = ("its input is not one floating tensor (ids, or several tensors)"
               if given is None else "one side holds no layer object for it"
               if None in units else "its output is not one tensor")
        return Substitution(layer, layer_class, "inconclusive", why=why), None
    runs = []
    for side, unit, nudged in ((reference, units[0], False), (reference, units[0], True),
                               (candidate, units[1], False)):
        run = run_unit(unit, native_input(given.forward, unit, side.names),
                       weight_of(side.names, trace, step), nudged=nudged)
        if run.why_not:
            return Substitution(layer, layer_class, "inconclusive",
                                why=f"the {side.name} layer: {run.why_not}"), None
        runs.append(run)
    judged = judge_substitution(layer, layer_class, runs[0].output, runs[1].output,
                                _shaped(runs[2].output, runs[0].output), captured.forward)
    return judged, (runs[0], runs[2])


def _shaped(candidate: np.ndarray, reference: np.ndarray) -> np.ndarray:
    a = np.asarray(candidate)
    return a.reshape(np.shape(reference)) if a.size == np.size(reference) else a
