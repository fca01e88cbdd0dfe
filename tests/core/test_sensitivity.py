"""Automatic mutants: which candidates get them, and the clip mutant's expectation, which must
come out the same when the run judges it and when its kept traces are judged again."""
import numpy as np

from verify.core.case import Case, Examples, Implementation, Mutation, PairSpec
from verify.core.names import NameMap
from verify.core.trace import Trace
from verify.core.sensitivity import DEFAULT_MUTANTS, KINDS, resolve, resolve_spec, with_mutants


class Observed:
    capabilities = frozenset({"mutations"})


class NotObserved:
    pass


def faithful_run(norms):
    trace = Trace("tf2")
    for step, norm in enumerate(norms, 1):
        trace.record(step, "grad", "w", np.float32([norm, 0.0]))
    return trace


def case():
    names = NameMap({"w": "w"})
    return Case("demo", Examples({"x": np.zeros(2)}, labels=np.zeros(2)), 1, 4,
                {"w": np.zeros(2, np.float32)},
                (Implementation("tf1", NotObserved(), names),
                 Implementation("tf2", Observed(), names),
                 Implementation("tf2-spe10", Observed(), names, capture_steps=False),
                 Implementation("legacy", NotObserved(), names)), "tf1")


def test_mutants_go_to_faithful_captured_candidates_whose_runner_applies_them():
    mutated = with_mutants(case(), KINDS, steps=1)
    added = [i for i in mutated.implementations if "~" in i.name]
    assert [i.name for i in added] == [f"tf2~{m.kind}" for m in DEFAULT_MUTANTS]
    assert {s.role for s in mutated.pair_specs() if "~" in s.candidate} == {"mutant"}
    dropped = next(i for i in added if i.mutation.kind == "drop_step")
    assert dropped.mutation.step == 1   # a one-step run drops step 1, not a step it never runs


def test_the_clip_mutant_learns_where_it_acts_from_the_faithful_run_the_same_way_twice():
    mutated = with_mutants(case(), ("clip_global_norm",))
    implementation = mutated.implementation("tf2~clip_global_norm")
    spec = next(s for s in mutated.pair_specs() if s.candidate == implementation.name)
    faithful = faithful_run([1.0, 3.0, 2.0, 5.0])         # median 2.5: step 2 first above
    ran, judged = resolve(implementation, spec, faithful)
    assert ran.mutation == Mutation("clip_global_norm", 2.5)
    assert (judged.expect.step, judged.expect.quantity) == (2, "grad")
    again = resolve_spec(spec, {"tf2": faithful}.__getitem__)   # from kept traces
    assert again.expect == judged.expect
    assert resolve_spec(PairSpec("demo", "tf1", "tf2"), None).expect is None


def test_a_candidate_that_already_clips_to_one_norm_is_clipped_at_half_of_it():
    spec = PairSpec("demo", "tf1", "tf2~clip_global_norm")
    resolved = resolve_spec(spec, {"tf2": faithful_run([0.5, 0.5, 0.5])}.__getitem__)
    assert resolved.expect.step == 1 and "clipped at half" in resolved.expect.why
