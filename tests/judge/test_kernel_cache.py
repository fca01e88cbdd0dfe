"""numba's cache of the kernels is fresh for every kernel module, not only the caller's own.

A caller cached with a callee of another module kept running the old callee after that module
changed (numba stamps a cache with its own file only); `verify.judge.kernel_cache` stamps the
kernels' caches with all their sources. Each run below is a fresh process: a process keeps
what it compiled."""
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("numba")

from verify.judge import kernel_cache  # noqa: E402

CALLEE = "import numba\n{install}\n\n@numba.njit(cache=True)\ndef step(x):\n    return x + {k}\n"
CALLER = textwrap.dedent("""\
    import numba
    {install}
    from scan_screen import step


    @numba.njit(cache=True)
    def twice(x):
        return step(x) * 2
    """)
INSTALL = "import kernel_cache\nkernel_cache.install()"


def kernels(directory: Path, k: int, install: bool) -> None:
    """A caller in scan_kernel.py and its callee in scan_screen.py (two of the names the
    stamp covers; the other two are empty), and a copy of kernel_cache beside them."""
    shutil.copy(kernel_cache.__file__, directory / "kernel_cache.py")
    hook = INSTALL if install else ""
    (directory / "scan_kernel.py").write_text(CALLER.format(install=hook))
    for name in kernel_cache.KERNEL_SOURCES:
        (directory / name).touch()
    change_callee(directory, k, install)


def change_callee(directory: Path, k: int, install: bool) -> None:
    """scan_screen.py alone rewritten: the caller's file keeps its bytes and its mtime (numba
    before 0.68 stamps a file by mtime and size, 0.68 by its contents)."""
    hook = INSTALL if install else ""
    (directory / "scan_screen.py").write_text(CALLEE.format(install=hook, k=k))


def twice_of_one(directory: Path) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": str(directory), "NUMBA_DEBUG_CACHE": "1"}
    env.pop("NUMBA_CACHE_DIR", None)
    env.pop("NUMBA_DISABLE_JIT", None)
    command = [sys.executable, "-c", "import scan_kernel; print(scan_kernel.twice(1))"]
    result = subprocess.run(command, cwd=directory, env=env, capture_output=True, text=True,
                            timeout=120, check=True)
    return int(result.stdout.strip().splitlines()[-1]), result.stdout


@pytest.mark.parametrize("install", [True, False], ids=["kernel_cache", "numbas-own-stamp"])
def test_a_changed_callee_reaches_its_cached_caller(tmp_path, install):
    kernels(tmp_path, 1, install)
    assert twice_of_one(tmp_path)[0] == 4
    loaded = twice_of_one(tmp_path)
    assert loaded[0] == 4 and "data loaded" in loaded[1]   # the cache serves an unchanged set
    change_callee(tmp_path, 2, install)                    # the callee's module changes
    if install:
        assert twice_of_one(tmp_path)[0] == 6
    else:   # negative control: numba's own stamp runs the cached caller with the old callee
        assert twice_of_one(tmp_path)[0] == 4


def test_the_shipped_kernels_are_stamped_with_every_kernel_source():
    from verify.judge import equal_kernel, scan_kernel, scan_screen, sparse_rows_kernel

    assert kernel_cache.install()   # installed once, before the kernels, and only once
    from numba.core import caching
    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl
    assert sum(getattr(c, "kernel_sources", False) for c in impl._locator_classes) == 1
    stamp = kernel_cache.sources_stamp()
    for kernel in (scan_kernel.scan, scan_screen.block_extremes, equal_kernel._equal_key_range,
                   sparse_rows_kernel._number_touched):
        assert kernel._cache._impl.locator.get_source_stamp() == stamp, kernel


def test_numbas_own_locator_choice_is_said_and_left_to_numba(monkeypatch):
    from numba import config

    monkeypatch.setattr(config, "CACHE_LOCATOR_CLASSES", "InTreeCacheLocator", raising=False)
    monkeypatch.setattr(kernel_cache, "_warned", [])
    with pytest.warns(RuntimeWarning, match="NUMBA_CACHE_LOCATOR_CLASSES chooses"):
        assert kernel_cache.install() is False


def test_kernel_sources_that_cannot_be_read_leave_the_kernel_to_numbas_own_locator(
        monkeypatch):
    """Sources in a zip (no file to read): numba's own locator, and a warning, not an error."""
    from numba.core import caching
    from verify.judge import scan_kernel

    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl
    ours = next(c for c in impl._locator_classes if getattr(c, "kernel_sources", False))

    def unreadable():
        raise NotADirectoryError("verify.zip/verify/judge/scan_kernel.py")

    monkeypatch.setattr(kernel_cache, "sources_stamp", unreadable)
    monkeypatch.setattr(kernel_cache, "_warned", [])
    with pytest.warns(RuntimeWarning, match="kernel sources cannot be read"):
        assert ours.from_function(scan_kernel.scan.py_func, scan_kernel.__file__) is None


def test_a_numba_without_a_locator_list_is_said_once_and_left_to_numba(monkeypatch):
    from numba.core import caching

    impl = getattr(caching, "CacheImpl", None) or caching._CacheImpl
    monkeypatch.setattr(impl, "_locator_classes", tuple(impl._locator_classes))
    monkeypatch.setattr(kernel_cache, "_warned", [])
    with pytest.warns(RuntimeWarning, match="delete the kernels' numba cache") as caught:
        assert kernel_cache.install() is False
        assert kernel_cache.install() is False
    assert len(caught) == 1
