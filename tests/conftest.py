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


@pytest.hookimpl(tryfirst=True)   # in place of the parity plugin's, whose groups it keeps
def pytest_xdist_make_scheduler(config, log):
    """Under `-n`: the parity plugin's groups (`verify.session.scheduling`: the pairs of one
    case and reference, or of one destination environment, share a worker), and the tests of a
    module that makes a module-scoped fixture (a trained pipeline, an environment's run, a
    built docs site), or of a folder whose conftest.py makes one its modules share, go to one
    xdist worker, so that fixture is made once, not once in every worker that draws one of its
    tests; every other test goes alone to whichever worker is free. The largest groups go
    first. (pytest-xdist's own `--dist loadgroup` marks do not group under pytest 9, whose
    node ids it can no longer rewrite.)"""
    from verify.session.plugin import SESSION_KEY
    from verify.session.scheduling import make_scheduler

    return make_scheduler(config, log, config.stash[SESSION_KEY].parts_dir,
                          lambda nodeid: shared_fixture_group(config.rootpath,
                                                              nodeid.split("::", 1)[0]))


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


SHARED_FIXTURE = re.compile(r"@pytest\.fixture\([^)]*scope=[\"'](?:module|session)[\"']")
