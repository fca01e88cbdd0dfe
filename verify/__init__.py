"""Numerical-equivalence verification for TensorFlow training migrations.

The flow, one package per stage: a case (`verify.core`) -> a run of each implementation
(`verify.runners`) -> `Trace` -> judging each pair (`verify.judge`: compare, verdict,
preflight, attribution) -> results (`verify.store.results`) -> reports (`verify.render`), history
(`verify.store.history`); `verify.session.parity_session` orchestrates, `verify.session.plugin` (pytest) and
`verify.__main__` (CLI) adapt it. Everything after the trace never imports TensorFlow.

The names a case module needs are importable from here::

    from verify import Case, Implementation, KerasRunner, NameMap, Tolerance, Tolerances
"""
from verify.core.case import Case, Examples, Expectation, Implementation, PairSpec, SparseIds
from verify.core.names import Mapped, NameMap, NameMapError, PermuteRows, Reshape, Transpose
from verify.core.tolerances import Tolerance, Tolerances
from verify.core.trace import SparseRows, Trace
from verify.judge import judge_pair
from verify.judge.attribution import attribute, attribute_pair
from verify.judge.compare import compare_traces, first_divergence
from verify.runners.tf1.estimator import EstimatorRunner
from verify.runners.keras.runner import KerasRunner
from verify.runners.keras3.runner import Keras3Runner
from verify.runners.lazy import lazy_runner
from verify.runners.loop.runner import LoopRunner
from verify.runners.loop.multi_worker import MultiWorkerLoopRunner
from verify.core.runner import Runner, RunRequest, RunSpec
from verify.checkpoint import ResumeRunner, convert_checkpoint

__all__ = [
    "Case", "EstimatorRunner", "Examples", "Expectation", "Implementation", "Keras3Runner",
    "KerasRunner", "LoopRunner", "Mapped", "MultiWorkerLoopRunner", "NameMap", "NameMapError",
    "PairSpec", "PermuteRows", "Reshape", "ResumeRunner", "RunRequest", "RunSpec", "Runner",
    "SparseIds", "SparseRows", "Tolerance", "Tolerances", "Trace", "Transpose", "attribute",
    "attribute_pair", "compare_traces", "convert_checkpoint", "first_divergence", "judge_pair",
    "lazy_runner",
]
