import functools
import re
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tf_devices():
    """TensorFlow's logical CPU devices, configured once per test process before any test can
    start the runtime (it cannot be split afterwards, whichever test runs first)."""
    from verify.runners.capture.devices import configure_cpu_replicas

    return configure_cpu_replicas()


@pytest.fixture(autouse=True)
def cpu_replicas(request):
    """Configure the devices before every test that uses TensorFlow (marked `slow`); tests that
    need no TensorFlow never import it."""
    if request.node.get_closest_marker("slow") is not None:
        return request.getfixturevalue("tf_devices")
    return None


def pytest_xdist_make_scheduler(config, log):
    """Under `-n`: the tests of a module that makes a module-scoped fixture (a trained pipeline,
    an environment's run, a built docs site), or of a folder whose conftest.py makes one its
    modules share, go to one xdist worker, so that fixture is made once, not once in every
    worker that draws one of its tests; the parity pairs of one case
    and reference go to one xdist worker, which runs that reference once and never waits for
    another worker to run it; every other test goes alone to whichever worker is free. The
    largest groups go first. (pytest-xdist's own `--dist loadgroup` marks do not group
    under pytest 9, whose node ids it can no longer rewrite.)"""
    if config.getvalue("dist") != "load":   # another --dist asked for: left to xdist
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedFixtureScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            pair = PARITY_PAIR.fullmatch(nodeid)
            if pair:   # the pairs of one reference: it runs once, and no worker waits for it
                return pair.group(1)
            path = nodeid.split("::", 1)[0]
            return shared_fixture_group(config.rootpath, path) or nodeid

    return SharedFixtureScheduling(config, log)


def shared_fixture_group(root: Path, path: str) -> str | None:
    """The group of the test module at `path` (relative to `root`): its folder when a
    conftest.py there (below tests/ itself) makes a session- or module-scoped fixture its
    modules share, the module when it makes a module-scoped fixture of its own, else None."""
    folder = Path(path).parent
    if folder != Path("tests") and makes_a_shared_fixture(root / folder / "conftest.py"):
        return str(folder)
    return path if makes_a_shared_fixture(root / path) else None


@functools.lru_cache(maxsize=None)
def makes_a_shared_fixture(path: Path) -> bool:
    """Whether the module at `path` defines a module- or session-scoped fixture."""
    return path.suffix == ".py" and path.is_file() and bool(
        SHARED_FIXTURE.search(path.read_text(encoding="utf-8", errors="replace")))


# verify/test_parity.py's ids: `case:reference-vs-candidate` (PairSpec.id)
PARITY_PAIR = re.compile(r"(verify/test_parity\.py::test_pair\[[^:\]]+:.+?)-vs-.+\]")
SHARED_FIXTURE = re.compile(r"@pytest\.fixture\([^)]*scope=[\"'](?:module|session)[\"']")
