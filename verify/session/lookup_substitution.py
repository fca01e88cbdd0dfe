"""Local or carried in, for an embedding lookup: its combiner run on both sides' declarations.

A layer replay names an embedding lookup (a TF1 `DenseFeatures`, a tfrs `TPUEmbedding`) as the
first divergent layer by its output after the combiner. Its input is ids, not a floating
tensor, and its layer object is not rebuilt: what such a lookup computes from its ids and its
table is fixed by the combiner each side declares (`table/<table>/combiner` in the static
config its trace keeps, `verify.runners.capture.static_config`). So the lookup is substituted
as that: the reference's ids at the step (the canonical per-example input its trace keeps) and
the reference's table before the step (its canonical weight), looked up with TensorFlow's own
op under each side's declared combiner (`verify.runners.capture.lookup_substitution`), and
judged as a layer is (`verify.explain.substitution`: 10 x the reference's one-ulp floor).

Which table and which feature: the tables the layer holds (`table/<layer>` or under it, of the
output's width) and the id features of the step (the replay's feature first), the first pair
whose lookup under the reference's combiner reproduces the output the replay captured on the
reference. A side that declares no combiner, or none this op runs, is said, not guessed.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from verify.core.inputs import InputFeature
from verify.core.layer_capture import LAYER_OUTPUT
from verify.core.quantities import INPUT, WEIGHT
from verify.core.trace import Trace, as_dense
from verify.explain.repro import write_lookup_repro
from verify.explain.substitution import FLOOR_MULTIPLE, LookupSubstitution, judge_substitution
from verify.session.substitution_values import Outcome, Side, layer_classes


def substitute_lookup(layer: str, part: str, reference: Side, candidate: Side,
                      reference_trace: Trace, candidate_trace: Trace | None, step: int,
                      repro_dir: Path | None) -> Outcome:
    """The embedding lookup `layer` (feature `part`, "" when the layer has one) substituted
    (see the module's docstring); its repro goes into `repro_dir` when found local."""
    found, values = _judged(layer, part, reference, candidate, reference_trace,
                            candidate_trace, step)
    sentence = f"substitution at step {step}: {found.sentence()}"
    if found.verdict == "alike":
        sentence += (f"; the difference at `{layer}` is carried in: under both sides' declared "
                     f"combiners the reference's ids and table look up alike, so what the "
                     f"lookup was given already differs (its ids, or its table before step "
                     f"{step}), or it looks up otherwise than its declared combiner says")
    repro = ""
    if found.verdict == "local" and repro_dir is not None:
        repro = str(write_lookup_repro(repro_dir, found, *values, step=step,
                                       sides=(reference.name, candidate.name),
                                       environment=candidate.environment))
    return Outcome(sentence, (found,), repro)


def _judged(layer, part, reference: Side, candidate: Side, trace: Trace,
            candidate_trace: Trace | None, step: int):
    """The judged `LookupSubstitution`, and the values it ran on (table, ids, row lengths)."""
    from verify.runners.capture.lookup_substitution import COMBINERS, run_lookup

    classes = layer_classes(layer, reference, candidate)
    made = dict(layer=layer, layer_class=classes, feature=part, table=layer)
    captured = reference.capture.by_key().get((layer, LAYER_OUTPUT, part))
    if captured is None:
        return LookupSubstitution(**made, verdict="inconclusive", why=(
            "the replay captured no single output of it on the reference")), None
    declared = trace.meta.declared_config or {}
    chosen = None
    for table, feature in _choices(layer, part, declared, trace, step, captured.forward):
        combiner = declared.get(f"table/{table}/combiner")
        if combiner not in COMBINERS:
            continue
        value = as_dense(trace.get(step - 1, WEIGHT, table))
        ids = trace.get(step, INPUT, feature)
        ran = run_lookup(value, ids.values, ids.lengths, combiner)
        nudged = run_lookup(value, ids.values, ids.lengths, combiner, nudged=True)
        floor = float(np.abs(np.asarray(nudged, np.float64) - ran).max(initial=0.0))
        if np.shape(ran) == np.shape(captured.forward) and float(np.abs(
                ran - captured.forward).max(initial=0.0)) <= FLOOR_MULTIPLE * floor:
            chosen = table, feature, combiner, value, ids, ran, nudged
            break
    if chosen is None:
        return LookupSubstitution(**made, verdict="inconclusive", why=(
            "no table of it the reference declares a combiner for (sum, mean, sqrtn), looked "
            "up on an id feature of the step, reproduces the output the replay captured on the "
            "reference (a weighted column, another lookup, or ids the trace did not keep)")), None
    table, feature, combiner, value, ids, ran, nudged = chosen
    made.update(table=table, feature=feature)
    theirs = (candidate_trace.meta.declared_config or {}).get(f"table/{table}/combiner") \
        if candidate_trace is not None else None
    if theirs not in COMBINERS:
        return LookupSubstitution(**made, combiners=(combiner, str(theirs or "")),
                                  verdict="inconclusive", why=(
            f"the candidate declares {'no combiner' if theirs is None else repr(theirs)} for "
            f"table `{table}` (`table/{table}/combiner` in its static config): there is no "
            f"single combiner of {', '.join(COMBINERS)} to run")), None
    other = run_lookup(value, ids.values, ids.lengths, theirs)
    judged = judge_substitution(layer, classes, ran, nudged, other, captured.forward)
    fields = {f.name: getattr(judged, f.name) for f in dataclasses.fields(judged)}
    found = LookupSubstitution(**{**fields, **made}, combiners=(combiner, theirs))
    return found, (np.asarray(value), np.asarray(ids.values), np.asarray(ids.lengths))


def _choices(layer: str, part: str, declared: dict, trace: Trace, step: int, output):
    """(table, feature) pairs that could have made `output`: tables the layer holds of its
    width, id features of the step with one list per example and ids within the table."""
    tables = [key.split("/", 1)[1].rsplit("/", 1)[0] for key in declared
              if key.startswith("table/") and key.endswith("/vocabulary_size")]
    features = [k.tensor for k in trace.keys_at(step) if k.quantity == INPUT]
    features = sorted(features, key=lambda name: name != part)
    for table in tables:
        if not (table == layer or table.startswith(layer + "/")):
            continue
        value = trace.get(step - 1, WEIGHT, table)
        if value is None or np.shape(as_dense(value))[-1:] != np.shape(output)[-1:]:
            continue
        rows = np.shape(as_dense(value))[0]
        for feature in features:
            ids = trace.get(step, INPUT, feature)
            if (isinstance(ids, InputFeature) and ids.values is not None
                    and len(ids.lengths) == np.shape(output)[0]
                    and np.array_equal(ids.values, np.round(ids.values))
                    and ids.values.min(initial=0) >= 0 and ids.values.max(initial=0) < rows):
                yield table, feature
