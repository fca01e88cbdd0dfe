"""Numerical-equivalence verification for TensorFlow training migrations.

The flow, one package per stage: a case (`verify.core`) -> a run of each implementation
(`verify.runners`) -> `Trace` -> judging each pair (`verify.judge`: compare, verdict,
preflight, attribution) -> what is kept on disk (`verify.store`: results, history) -> reports
(`verify.render`); `verify.session` runs a session (its pytest plugin `verify.session.plugin`),
`verify.cli` and `verify.__main__` are the commands. Everything after the trace never imports
TensorFlow.

The names a case module needs are importable from here::

    from verify import Case, Implementation, KerasRunner, NameMap, Tolerance, Tolerances

Each is imported when it is first used: `import verify` loads no runner and no TensorFlow
(`python -m verify report` never does), `verify.KerasRunner` loads that runner's module.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# name -> the module that defines it; imported on first use (PEP 562)
_HOMES = {
    "verify.core.case": ("Case", "Examples", "Expectation", "Implementation", "PairSpec",
                         "SparseIds"),
    "verify.core.names": ("Mapped", "NameMap", "NameMapError", "PermuteRows", "Reshape",
                          "Transpose"),
    "verify.core.tolerances": ("Tolerance", "Tolerances"),
    "verify.core.trace": ("SparseRows", "Trace"),
    "verify.core.runner": ("Runner", "RunRequest", "RunSpec"),
    "verify.judge": ("judge_pair",),
    "verify.judge.attribution": ("attribute", "attribute_pair"),
    "verify.judge.compare": ("compare_traces", "first_divergence"),
    "verify.runners.tf1.estimator": ("EstimatorRunner",),
    "verify.runners.keras.runner": ("KerasRunner",),
    "verify.runners.keras3.runner": ("Keras3Runner",),
    "verify.runners.lazy": ("lazy_runner",),
    "verify.runners.loop.runner": ("LoopRunner",),
    "verify.runners.loop.multi_worker": ("MultiWorkerLoopRunner",),
    "verify.checkpoint": ("ResumeRunner", "convert_checkpoint"),
}
_HOME = {name: module for module, names in _HOMES.items() for name in names}

__all__ = sorted(_HOME, key=lambda name: (name[0].islower(), name))


def __getattr__(name: str):
    """`verify.<name>` for a public name: its module imported now, the value kept here.

    >>> import verify
    >>> verify.Tolerance.__module__
    'verify.core.tolerances'
    """
    module = _HOME.get(name)
    if module is None:
        raise AttributeError(f"module 'verify' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


if TYPE_CHECKING:   # for type checkers and the API reference, which read the names statically
    from verify.checkpoint import ResumeRunner, convert_checkpoint
    from verify.core.case import (Case, Examples, Expectation, Implementation, PairSpec,
                                  SparseIds)
    from verify.core.names import (Mapped, NameMap, NameMapError, PermuteRows, Reshape,
                                   Transpose)
    from verify.core.runner import Runner, RunRequest, RunSpec
    from verify.core.tolerances import Tolerance, Tolerances
    from verify.core.trace import SparseRows, Trace
    from verify.judge import judge_pair
    from verify.judge.attribution import attribute, attribute_pair
    from verify.judge.compare import compare_traces, first_divergence
    from verify.runners.keras.runner import KerasRunner
    from verify.runners.keras3.runner import Keras3Runner
    from verify.runners.lazy import lazy_runner
    from verify.runners.loop.multi_worker import MultiWorkerLoopRunner
    from verify.runners.loop.runner import LoopRunner
    from verify.runners.tf1.estimator import EstimatorRunner
