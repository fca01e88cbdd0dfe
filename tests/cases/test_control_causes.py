"""Every shipped negative control declares the cause of `verify.explain` that must explain it,
unless it is listed here with why no hypothesis can tell it: a control the numbers catch names
a hypothesis (`Expectation.cause`), one that preflight alone catches names the blocking finding
it is caught by (`Implementation.preflight_cause`, 'declared KEY-PATTERN'); each declared cause
is one the explanation stage can find; and at least 90% of the shipped control pairs
declare one."""
import fnmatch

from verify.explain import CAUSES
from verify.runners.case_sources import load_cases, resolve_sources

# Controls caught by the numbers that no hypothesis of verify.explain can tell, and why.
NOT_EXPLAINABLE: dict[str, str] = {}
# Controls caught by a run that raises (quantity 'run'): no numbers to explain. The pair's
# message already says what a cause could: the error, the step it raised at (the first
# divergence, so every earlier step agreed) and where (a traceback 'in user code:' while
# tracing the first step, 'Graph execution error' running it, a checkpoint race after step k).
RUN_FAILURES = ("control-sum-over-batch-size", "control-unchanged-loop",
                "control-worker-shared-checkpoint")
THRESHOLD = 0.9


def shipped_cases():
    return load_cases(resolve_sources(["cases"])).values()


def shipped_controls():
    """(case, implementation) of every shipped control: caught by the numbers (`expect`), by
    preflight (`preflight_expect`) or both."""
    return [(case.name, implementation) for case in shipped_cases()
            for implementation in case.implementations if implementation.is_control]


def declared_cause(case: str, implementation) -> str:
    """The cause a control declares, checked against what it is caught by; '' for none."""
    expect, name = implementation.expect, implementation.name
    if expect is None:   # caught by preflight alone: the numbers agree
        cause = implementation.preflight_cause
        pattern = cause.partition(" ")[2]
        assert cause.startswith("declared ") and pattern in implementation.preflight_expect, \
            f"{case} {name}: preflight alone catches it; declares {cause!r}, not 'declared' " \
            f"with one of {implementation.preflight_expect}"
        return cause
    if expect.quantity == "run":
        assert name.startswith(RUN_FAILURES), f"{case} {name}: a run failure not listed"
        assert not expect.cause, f"{case} {name}: a run failure declares {expect.cause!r}"
        return ""
    if name in NOT_EXPLAINABLE:
        assert not expect.cause, f"{name} declares a cause and is listed as not one"
        return ""
    assert expect.cause, f"{case} {name}: declares no cause and is not listed with why"
    return expect.cause


def test_every_control_declares_its_cause_or_says_why_not():
    for case, implementation in shipped_controls():
        cause = declared_cause(case, implementation)
        assert not cause or cause.split(" ")[0] in CAUSES, f"{case} {implementation.name}"
    # counted over the control pairs, with the cause `verify.explain.explain_pair` expects
    pairs = [spec for case in shipped_cases() for spec in case.pair_specs() if spec.control]
    declaring = [spec for spec in pairs
                 if (spec.expect.cause if spec.expect is not None else spec.preflight_cause)]
    assert len(pairs) >= 55 and len(declaring) / len(pairs) >= THRESHOLD, \
        (len(declaring), len(pairs))


def test_a_preflight_cause_names_a_key_its_control_must_be_caught_by():
    for case, implementation in shipped_controls():
        pattern = implementation.preflight_cause.partition(" ")[2]
        if implementation.preflight_cause:
            assert any(fnmatch.fnmatchcase(pattern, p) for p in implementation.preflight_expect)


def test_the_list_of_unexplainable_controls_names_only_shipped_controls():
    names = {implementation.name for _, implementation in shipped_controls()}
    assert set(NOT_EXPLAINABLE) <= names
