"""numba's on-disk cache of the comparison kernels, invalidated when any kernel module changes.

numba checks a cached function against its own source file only. `scan_kernel.scan` calls
`scan_screen.block_extremes`; compiled and cached, it keeps the `block_extremes` of that day:
after scan_screen.py changes (an upgrade that rewrites only that file, an edit, a checkout) it
loads the old code from the cache and judges with it (measured: a changed excess count in
`block_extremes` did not reach `scan` until its cache was deleted). numba documents this: it
does not track changes in functions called from another file.

`install()` puts a locator before numba's own for the functions of the kernel modules
(`KERNEL_SOURCES`): the cache directory numba would choose, with a source stamp that hashes
the contents of every kernel module, so a change in any one of them invalidates the cache of
all. Functions of any other file (a user's own numba code) are located as numba locates them.

    >>> install()   # before the kernels' @numba.njit(cache=True); again, a no-op
    True
"""
from __future__ import annotations

import hashlib
import warnings
from pathlib import Path

KERNEL_SOURCES = ("scan_kernel.py", "scan_screen.py", "scan_deferred.py",
                  "sparse_rows_kernel.py", "equal_kernel.py")
HERE = Path(__file__).resolve().parent


def readonly(array):
    """A read-only view of `array`: what the kernels are called with. numba compiles a read-only
    array apart from a writable one, and a trace's large values are read-only (spilled to
    disk, or loaded): viewed read-only every time, every call uses the one specialization the
    warm-up compiles.

    >>> import numpy as np
    >>> readonly(np.zeros(2)).flags.writeable
    False
    """
    view = array.view()
    view.flags.writeable = False
    return view


def kernel_files() -> tuple[Path, ...]:
    """The kernel modules' paths."""
    return tuple(HERE / name for name in KERNEL_SOURCES)


def sources_stamp() -> str:
    """The hash of every kernel module's contents, in `KERNEL_SOURCES` order: what each
    kernel's cache is fresh for."""
    digest = hashlib.sha256()
    for path in kernel_files():
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _locator_class():
    """numba's locator protocol with the kernels' stamp; None on a numba without it."""
    try:
        from numba.core import caching
        base = caching._CacheLocator
    except (ImportError, AttributeError):
        return None

    class KernelSourcesLocator(base):
        """Where numba's own locators put a kernel's cache, fresh for all kernel sources."""

        def __init__(self, inner, py_file, stamp):
            self._inner, self._py_file, self._stamp = inner, py_file, stamp

        def ensure_cache_path(self):
            self._inner.ensure_cache_path()

        def get_cache_path(self):
            return self._inner.get_cache_path()

        def get_source_stamp(self):
            return self._stamp

        def get_disambiguator(self):
            return self._inner.get_disambiguator()

        @classmethod
        def from_function(cls, py_func, py_file):
            try:
                if Path(py_file).resolve() not in kernel_files():
                    return None
            except OSError:
                return None
            try:
                stamp = sources_stamp()
            except OSError as error:   # sources not readable as files (a zip): numba's own
                _warn_once(f"the kernel sources cannot be read ({error})")
                return None
            for numbas_own in cls.numbas_own:
                inner = numbas_own.from_function(py_func, py_file)
                if inner is not None:
                    return cls(inner, py_file, stamp)
            return None

    return KernelSourcesLocator


def install() -> bool:
    """Put the kernels' locator first in numba's list (once per process); False, with a
    warning, when this numba has no such list to extend or NUMBA_CACHE_LOCATOR_CLASSES makes
    numba ignore it: the kernels are then cached as numba caches them, each stamped with its
    own file only (as they are, with the same warning, when their sources cannot be read as
    files: a zip)."""
    try:
        from numba.core import caching
    except ImportError:
        return False
    from numba import config

    if getattr(config, "CACHE_LOCATOR_CLASSES", None):   # numba then ignores the list below
        _warn_once("NUMBA_CACHE_LOCATOR_CLASSES chooses numba's cache locators")
        return False
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    classes = getattr(impl, "_locator_classes", None)
    if isinstance(classes, list) and any(getattr(c, "kernel_sources", False) for c in classes):
        return True
    locator = _locator_class() if isinstance(classes, list) else None
    if locator is None:
        _warn_once("this numba has no list of cache locators to extend")
        return False
    locator.kernel_sources = True
    locator.numbas_own = tuple(classes)
    classes.insert(0, locator)
    return True


_warned = []


def _warn_once(why: str) -> None:
    if not _warned:
        _warned.append(True)
        warnings.warn(f"the comparison kernels' numba cache is not stamped with every kernel "
                      f"module ({why}): after an upgrade or edit that changes one of "
                      f"{', '.join(KERNEL_SOURCES)}, delete the kernels' numba cache (*.nbi and "
                      f"*.nbc in verify/judge/__pycache__, in NUMBA_CACHE_DIR, or in the "
                      f"user-wide numba cache) so that no kernel runs an older one's code",
                      RuntimeWarning, stacklevel=3)
