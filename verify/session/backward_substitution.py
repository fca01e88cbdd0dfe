"""Local or carried in, backward: a replayed step whose layers all agree forward and whose first
divergence is a gradient flowing back through a layer.

The layer replay walks the gradients back, last layer first; the first that differs is at a
layer's input (the gradient its backward pass produced) or at its output (the gradient arriving
from the layers after it: carried in from there). For the former, both sides' layers, rebuilt
from their configs (`verify.runners.capture.substitution`), run their backward pass on the same
values: the reference's input and weights (as the forward substitution gives them) and the
reference's captured gradient at the layer's output. Their gradients with respect to the input
and to each trainable variable, in canonical layout, are judged one by one against the
reference's own, moved one ulp (inputs, weights and upstream gradient) as the floor
(`verify.explain.substitution`); the worst decides. No repro is written for a backward pass.
"""
from __future__ import annotations

import numpy as np

from verify.core.trace import Trace
from verify.explain.substitution import (FLOOR_MULTIPLE, Substitution, judge_substitution,
                                         times_bound)
from verify.session.substitution_values import (Outcome, layer_classes, native_input,
                                               weight_of)


def substitute_backward(comparison, reference, candidate, trace: Trace, step: int):
    """The backward substitution of `comparison`'s first divergent gradient (see the module's
    docstring), as a `verify.session.substitution.Outcome`."""
    rows = comparison.rows
    failed = rows[(rows["direction"] == "backward") & (rows["status"] == "failed")]
    if failed.empty:
        return Outcome("")
    layer, kind = str(failed.iloc[0]["layer"]), str(failed.iloc[0]["kind"])
    head = f"backward substitution at step {step}: "
    if layer == "loss":
        return Outcome(head + "the gradient arriving at the per-example loss already differs: "
                              "it comes from the loss's reduction; not substituted")
    if kind != "input":
        return Outcome(head + f"the gradient arriving at `{layer}`'s {kind} already differs: "
                              f"carried in from the layers after it; not substituted")
    judged = _judged(layer, reference, candidate, trace, step)
    worst = judged[0]
    name = f"layer `{layer}` ({worst.layer_class})"
    if worst.verdict == "inconclusive":
        return Outcome(head + f"{name} not substituted: {worst.why}", tuple(judged))
    figures = (f"its gradient with respect to {worst.layer} differs by {worst.drift:.3g} ("
               f"{'beyond' if worst.verdict == 'local' else 'within'} {FLOOR_MULTIPLE:g} x its "
               f"one-ulp floor {worst.floor:.3g} = {worst.bound:.3g})")
    if worst.verdict == "local":
        return Outcome(head + f"local to the backward pass of {name}: given identical "
                              f"upstream gradients, inputs and weights {figures}",
                       tuple(judged))
    return Outcome(head + f"the backward pass of {name} computes alike: given identical "
                          f"upstream gradients, inputs and weights {figures}; the difference "
                          f"is carried in", tuple(judged))


def _judged(layer: str, reference, candidate, trace: Trace, step: int) -> list[Substitution]:
    """One `Substitution` per gradient (its `layer` field names what the gradient is taken
    with respect to), the worst first; or one saying why none was taken."""
    from verify.runners.capture.substitution import run_unit

    observed = reference.capture.by_key()
    given, out = observed.get((layer, "input", "")), observed.get((layer, "output", ""))
    units = reference.capture.units.get(layer), candidate.capture.units.get(layer)
    layer_class = layer_classes(layer, reference, candidate)
    if None in units or given is None or out is None or out.backward is None:
        return [Substitution(layer, layer_class, "inconclusive", why=(
            "its input is not one floating tensor, its output's gradient was not observed, "
            "or one side holds no layer object for it"))]
    runs = []
    for side, unit, nudged in ((reference, units[0], False), (reference, units[0], True),
                               (candidate, units[1], False)):
        run = run_unit(unit, native_input(given.forward, unit, side.names),
                       weight_of(side.names, trace, step), nudged=nudged,
                       upstream=out.backward)
        if run.why_not:
            return [Substitution(layer, layer_class, "inconclusive",
                                 why=f"the {side.name} layer: {run.why_not}")]
        runs.append(_canonical(run.gradients, unit, side.names))
    captured = {"its input": given.backward}
    judged = [judge_substitution(what, layer_class, runs[0][what], runs[1][what],
                                 runs[2].get(what, np.full(1, np.nan)),
                                 captured.get(what, runs[0][what]))
              for what in runs[0]]
    return sorted(judged, key=times_bound, reverse=True)


def _canonical(gradients: dict, unit, names) -> dict[str, np.ndarray]:
    """A side's backward-pass gradients in canonical terms: "its input" (the last axis put
    back in canonical order) and `variable/name` for each trainable variable's."""
    from verify.core.layer_capture import input_permutation
    from verify.runners.capture.substitution import unit_variables

    out = {}
    permutation = input_permutation(unit_variables(unit), names)
    value = np.asarray(gradients["input"])
    out["its input"] = value if permutation is None else np.moveaxis(
        permutation.to_canonical(np.moveaxis(value, -1, 0)), 0, -1)
    for native, gradient in gradients.items():
        found = None if native == "input" else names.canonical_of(native)
        if found is not None:
            out[f"`{found[0]}`"] = np.asarray(found[1].to_canonical(np.asarray(gradient)))
    return out
