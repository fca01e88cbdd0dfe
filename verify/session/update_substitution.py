"""Local or carried in, for a pair whose first divergence is in its weights or slots: each
side's optimizer applied to the reference's gradient and state.

A pair whose gradients agree at step 1 and whose weights after it do not has either an update
rule that differs (a learning rate, an epsilon) or gradients that differed by less than their
tolerance and were amplified. Each side's optimizer is rebuilt from its declared config (its
class identified by its own step-1 update, `verify.runners.capture.update_substitution`) and
applied, once, to the same values: the reference's weights before step 1 and its gradient at
step 1, in canonical names (an optimizer's update is elementwise, so a layout does not change
it). Per tensor, the candidate's updated weights are judged against the reference's, with the
reference's optimizer run again on weights and gradient moved one ulp as the floor
(`verify.explain.substitution`); a local update gets a repro (`verify.explain.repro`).

Nothing runs again but the optimizers' one update: the values are the judged traces'.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from verify.core.meta import SUITE_ENVIRONMENT
from verify.core.trace import Trace, as_dense
from verify.explain.repro import write_update_repro
from verify.explain.substitution import FLOOR_MULTIPLE, judge_substitution, times_bound
from verify.session.substitution_values import Outcome

PREFIX = "optimizer/model/"
WHERE = ("weight", "slot")   # first divergences an update substitution is tried for


def substitute_update(reference: Trace, candidate: Trace, step: int, environments: tuple,
                      repro_dir: Path | None, write_alike: bool = False) -> Outcome:
    """The update substitution of a pair first diverging in `weight` or `slot` at `step` (see
    the module's docstring): a sentence, and the repro written when the update is local (or
    whatever it is, with `write_alike`: a faithful pair's repro, which passes)."""
    head = f"optimizer-update substitution at step {step}: "
    if step != 1:
        return Outcome(head + "not run: only step 1's update is substituted (later steps "
                              "would need the reference's slots and step count set into each "
                              "side's optimizer)")
    away = [e for e in environments if e != SUITE_ENVIRONMENT]
    if away:
        return Outcome(head + f"not run: a side runs in environment {away[0]!r}; the "
                              f"substitution rebuilds optimizers in the suite's own only")
    values = [_values(trace) for trace in (reference, candidate)]
    names = sorted(set(values[0][0]) & set(values[1][0]))
    if not names:
        return Outcome(head + "not run: no variable has a weight before and after step 1 and "
                              "a gradient on both sides")
    from verify.runners.capture.update_substitution import (apply_update, constructor_arguments,
                                                            identify, nudged_values)
    sides = []
    for trace, (weights, gradients, after) in zip((reference, candidate), values):
        declared = {k[len(PREFIX):]: v for k, v in trace.meta.declared_config.items()
                    if k.startswith(PREFIX)}
        kind = str(declared.get("kind", ""))
        path, why = identify(kind, declared, _only(weights, names), _only(gradients, names),
                             _only(after, names), FLOOR_MULTIPLE)
        if not path:
            return Outcome(head + f"not run: {trace.implementation}'s optimizer: {why}")
        sides.append((path, constructor_arguments(kind, declared, path)))
    weights, gradients = _only(values[0][0], names), _only(values[0][1], names)
    ref = apply_update(*sides[0], weights, gradients)
    nudged = apply_update(*sides[0], nudged_values(weights), nudged_values(gradients))
    cand = apply_update(*sides[1], weights, gradients)
    judged = [judge_substitution(name, "optimizer update", ref[name], nudged[name],
                                 cand[name], values[0][2][name]) for name in names]
    worst = max(judged, key=times_bound)   # an inconclusive tensor first
    judged = [worst] + [s for s in judged if s is not worst]   # the worst first
    classes = " | ".join(dict.fromkeys(path for path, _ in sides)) + _differing(sides)
    if worst.verdict == "inconclusive":   # neither local nor alike can be said
        return Outcome(head + f"inconclusive for the optimizer update ({classes}): "
                              f"`{worst.layer}`: {worst.why}", tuple(judged))
    figures = (f"its update of `{worst.layer}` differs by {worst.drift:.3g} ("
               f"{'beyond' if worst.verdict == 'local' else 'within'} {FLOOR_MULTIPLE:g} x its "
               f"one-ulp floor {worst.floor:.3g} = {worst.bound:.3g})")
    repro = "" if repro_dir is None or not (worst.verdict == "local" or write_alike) else \
        str(write_update_repro(repro_dir, judged, sides, weights, gradients, step=step,
                               names=(reference.implementation, candidate.implementation)))
    if worst.verdict == "local":
        return Outcome(head + f"local to the optimizer update ({classes}): with identical "
                              f"gradients, weights and state {figures}: the update rule "
                              f"itself differs", tuple(judged), repro)
    return Outcome(head + f"the optimizer update computes alike ({classes}): with identical "
                          f"gradients, weights and state {figures}; the difference is carried "
                          f"in with the gradients it was given", tuple(judged), repro)


def _differing(sides) -> str:
    """The declared hyperparameters the two sides give differently: "; learning_rate 0.001 |
    0.00101" ('' when none do)."""
    (_, a), (_, b) = sides
    differing = [f"{k} {a.get(k, 'unset')} | {b.get(k, 'unset')}" for k in sorted({*a, *b})
                 if a.get(k) != b.get(k)]
    return "; " + ", ".join(differing) if differing else ""


def _values(trace: Trace) -> tuple[dict, dict, dict]:
    """Canonical weights before step 1, gradients at step 1 and weights after it."""
    out = []
    for step, quantity in ((0, "weight"), (1, "grad"), (1, "weight")):
        out.append({k.tensor: np.asarray(as_dense(trace.get(step, quantity, k.tensor)))
                    for k in trace.keys_at(step) if k.quantity == quantity})
    names = set(out[0]) & set(out[1]) & set(out[2])
    return tuple({n: v for n, v in values.items() if n in names} for values in out)


def _only(values: dict, names: list[str]) -> dict:
    return {name: values[name] for name in names}
