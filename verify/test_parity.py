"""The parity suite: one test per (case, reference, candidate) pair.

A faithful pair must agree within tolerance at every step; a negative control must be caught
at the step and quantity it declares. A selection that holds no pair is one failing test that
says why. See verify/session/plugin.py for options and the report.
"""
import pytest

from verify.session.parity_session import NoPairs

pytestmark = pytest.mark.slow   # trains real implementations


def pytest_generate_tests(metafunc):
    if "pair" in metafunc.fixturenames:
        from verify.session.plugin import SESSION_KEY

        pairs = metafunc.config.stash[SESSION_KEY].selection()
        metafunc.parametrize("pair", pairs, ids=[p.id for p in pairs])


def test_pair(pair, parity, request):
    if isinstance(pair, NoPairs):
        parity.record_nothing_selected(pair, request.node.nodeid)
        pytest.fail(pair.why, pytrace=False)
    verdict = parity.check(pair, request.node.nodeid).verdict
    assert verdict.ok, f"{verdict.status}: {verdict.message}"
