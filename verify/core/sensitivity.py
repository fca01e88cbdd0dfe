"""Detection limits: automatic mutants of every faithful candidate, each of which the suite must
catch where it first acts, at least 10x beyond tolerance.

For each faithful, captured candidate of a case the session adds, through the candidate's
optimizer tap (`verify.runners.capture.mutations`), one mutant per kind:

- `learning_rate`: the learning rate x1.01, first acting on the weights of step 1;
- `epsilon`: the optimizer's epsilon x10 (optimizers that have one), weights of step 1;
- `clip_global_norm`: the applied gradients clipped at the median global norm of the
  candidate's own faithful run, first acting on the gradients of the first step above it;
- `drop_step`: the gradients of step 2 dropped (zeros), acting on the gradients of step 2.

Each mutant is judged against the candidate's reference like a negative control. The report
lists per case which were caught and by how much: the case's detection limit. Shipped cases
run them by default; `--sensitivity` adds them to any case.

>>> [m.describe() for m in DEFAULT_MUTANTS[:2]]
['learning rate x1.01', 'epsilon x10']
"""
from __future__ import annotations

import dataclasses
import fnmatch

import numpy as np

from verify.core.case import Case, Expectation, Implementation, Mutation, PairSpec
from verify.core.meta import SUITE_ENVIRONMENT
from verify.core.trace import Trace, as_dense
from verify.core.runner import capabilities

MUTANT_MARK = "~"   # mutant names: "<candidate>~<kind>"
DROPPED_STEP = 2
DEFAULT_MUTANTS = (Mutation("learning_rate", 1.01), Mutation("epsilon", 10.0),
                   Mutation("clip_global_norm", 0.0), Mutation("drop_step", step=DROPPED_STEP))
KINDS = tuple(m.kind for m in DEFAULT_MUTANTS)


def mutant_name(candidate: str, kind: str) -> str:
    return f"{candidate}{MUTANT_MARK}{kind}"


def is_mutant(name: str) -> bool:
    return MUTANT_MARK in name


def with_mutants(case: Case, kinds: tuple[str, ...], steps: int | None = None,
                 every_candidate: bool = False) -> Case:
    """`case` with one mutant implementation per kind for every faithful captured candidate
    of the suite's own environment whose runner can apply mutations, each paired with the candidate's reference. `steps` is
    how long the session trains (the dropped step is step 2, or 1 in a one-step run).
    `every_candidate` ignores the case's `sensitivity_candidates` (--sensitivity)."""
    last = steps or case.steps
    implementations, pairs = list(case.implementations), list(case.all_pairs())
    for reference, candidate in case.all_pairs():
        implementation = case.implementation(candidate)
        if case.sensitivity_candidates and not every_candidate and not any(
                fnmatch.fnmatchcase(candidate, p) for p in case.sensitivity_candidates):
            continue
        if (implementation.is_control or not implementation.capture_steps
                or implementation.mutation is not None or is_mutant(candidate)
                # a mutant is built in this process; one in another environment is not
                or implementation.environment != SUITE_ENVIRONMENT
                or "mutations" not in capabilities(implementation.runner)):
            continue
        for mutation in DEFAULT_MUTANTS:
            if mutation.kind not in kinds:
                continue
            name = mutant_name(candidate, mutation.kind)
            if any(i.name == name for i in implementations):
                continue
            if mutation.kind == "drop_step":
                mutation = dataclasses.replace(mutation, step=min(DROPPED_STEP, last))
            expect = _first_effect(mutation)
            implementations.append(dataclasses.replace(
                implementation, name=name, mutation=mutation, expect=expect,
                description=f"mutant of {candidate}: {mutation.describe()}"))
            pairs.append((reference, name))
    return dataclasses.replace(case, implementations=tuple(implementations), pairs=tuple(pairs))


def _first_effect(mutation: Mutation) -> Expectation:
    if mutation.kind == "learning_rate":   # FTRL's linear slot already depends on it
        return Expectation(1, "slot|weight", why=f"{mutation.describe()}: the first update "
                                                 f"differs", cause=declared_cause(mutation))
    if mutation.kind == "epsilon":
        return Expectation(1, "weight", why=f"{mutation.describe()}: the first update differs",
                           cause=declared_cause(mutation))
    if mutation.kind == "drop_step":
        return Expectation(mutation.step, "grad",
                           why=f"the applied gradients of step {mutation.step} are zeros",
                           cause=declared_cause(mutation))
    # clip_global_norm: the step is known once the faithful run is (see resolve)
    return Expectation(1, "grad", why="gradients clipped at the faithful run's median norm")


def declared_cause(mutation: Mutation) -> str:
    """The hypothesis of `verify.explain` that must explain a mutant, with its value.

    >>> declared_cause(Mutation("learning_rate", 1.01)), declared_cause(Mutation("drop_step", step=2))
    ('learning_rate x1.01', 'drop_step 2')
    """
    if mutation.kind == "drop_step":
        return f"drop_step {mutation.step}"
    if mutation.kind == "clip_global_norm":
        return f"clip_global_norm {mutation.value:.6g}"
    return f"{mutation.kind} x{mutation.value:g}"


def base_candidate(name: str) -> str:
    return name.split(MUTANT_MARK, 1)[0]


def resolve(implementation: Implementation, spec: PairSpec,
            faithful: Trace) -> tuple[Implementation, PairSpec]:
    """Fill in what a mutant learns from its candidate's faithful run: the median global
    gradient norm to clip at, and the first step whose norm is above it."""
    mutation = implementation.mutation
    if mutation is None or mutation.kind != "clip_global_norm" or mutation.value > 0:
        return implementation, spec
    clip, expect = clip_at_median(faithful, base_candidate(implementation.name))
    implementation = dataclasses.replace(implementation, expect=expect,
                                         mutation=dataclasses.replace(mutation, value=clip))
    return implementation, dataclasses.replace(spec, expect=expect)


def resolve_spec(spec: PairSpec, traces) -> PairSpec:
    """The spec of a kept pair as the run judged it: a clip mutant's expectation comes from
    its candidate's faithful trace (`traces(name)`), as it did when it ran."""
    if not spec.candidate.endswith(MUTANT_MARK + "clip_global_norm"):
        return spec
    base = base_candidate(spec.candidate)
    return dataclasses.replace(spec, expect=clip_at_median(traces(base), base)[1])


def clip_at_median(faithful: Trace, name: str) -> tuple[float, Expectation]:
    """The norm to clip at (the faithful run's median global gradient norm) and where the
    clipping first acts."""
    norms = global_gradient_norms(faithful)
    if not norms:
        raise ValueError(f"{name} captured no gradients to take a median norm from")
    median = float(np.median(list(norms.values())))
    above = [step for step, norm in norms.items() if norm > median * (1 + 1e-3)]
    if above:
        clip, first = median, min(above)
        why = (f"gradients clipped at the faithful run's median global norm {median:.3g}; "
               f"step {first} is the first above it")
    else:   # the candidate's gradients are already clipped to one norm: clip at half of it
        clip, first = median / 2, min(norms)
        why = (f"the faithful run's gradients all have norm {median:.3g} (clipped by its own "
               f"step): clipped at half of it, acting from step {first}")
    return clip, Expectation(first, "grad", why=why,
                             cause=declared_cause(Mutation("clip_global_norm", clip)))


def global_gradient_norms(trace: Trace) -> dict[int, float]:
    """The global norm of the captured gradients, per step."""
    sums: dict[int, float] = {}
    for key, value in trace.values.items():
        if key.quantity == "grad" and not isinstance(value, str):
            dense = as_dense(value).astype(np.float64)
            sums[key.step] = sums.get(key.step, 0.0) + float((dense ** 2).sum())
    return {step: float(np.sqrt(total)) for step, total in sums.items()}
