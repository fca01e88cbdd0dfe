"""Every shipped negative control that the numbers must catch declares the hypothesis of
`verify.explain` that must explain it, unless it is listed here with why no hypothesis can
tell it from the captured numbers; each declared cause is one the explanation stage can find;
and the controls that declare one are at least 90% of those the numbers catch."""
from verify.explain import CAUSES
from verify.runners.case_sources import load_cases, resolve_sources

# Controls caught by the numbers that no hypothesis of verify.explain can tell, and why.
NOT_EXPLAINABLE: dict[str, str] = {}
# Controls caught by a run that fails (quantity 'run'): no numbers to explain, the run's error
# says why (shown as the pair's message).
RUN_FAILURES = ("control-sum-over-batch-size", "control-unchanged-loop",
                "control-worker-shared-checkpoint")
THRESHOLD = 0.9


def shipped_controls():
    """(case, implementation) of every shipped control with an expectation."""
    cases = load_cases(resolve_sources(["cases"]))
    return [(case.name, implementation) for case in cases.values()
            for implementation in case.implementations if implementation.expect is not None]


def test_every_numeric_control_declares_its_cause_or_says_why_not():
    numeric, declaring = 0, 0
    for case, implementation in shipped_controls():
        expect, name = implementation.expect, implementation.name
        if expect.quantity == "run":
            assert name.startswith(RUN_FAILURES), f"{case} {name}: a run failure not listed"
            assert not expect.cause, f"{case} {name}: a run failure declares {expect.cause!r}"
            continue
        numeric += 1
        if name in NOT_EXPLAINABLE:
            assert not expect.cause, f"{name} declares a cause and is listed as not one"
            continue
        assert expect.cause, f"{case} {name}: declares no cause and is not listed with why"
        assert expect.cause.split(" ")[0] in CAUSES, f"{case} {name}: {expect.cause!r}"
        declaring += 1
    assert numeric >= 40 and declaring / numeric >= THRESHOLD, (declaring, numeric)


def test_the_list_of_unexplainable_controls_names_only_shipped_controls():
    names = {implementation.name for _, implementation in shipped_controls()}
    assert set(NOT_EXPLAINABLE) <= names
