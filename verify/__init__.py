"""Numerical-equivalence verification for TensorFlow training migrations.

The flow: a case (`cases/`) -> `run_implementation` -> `Trace` -> `compare_traces` -> drift
rows -> report. The compare and report stages never import TensorFlow.
"""
from verify.case import Case, Examples, Expectation, Implementation, RunRequest, SparseIds
from verify.compare import compare_traces, first_divergence
from verify.estimator_runner import EstimatorRunner
from verify.keras_runner import KerasRunner
from verify.loop_runner import LoopRunner
from verify.names import Mapped, NameMap, NameMapError, PermuteRows, Reshape, Transpose
from verify.attribution import attribute, attribute_pair
from verify.oracle import EmbeddingMLP, OracleRunner
from verify.tolerances import Tolerance, Tolerances
from verify.trace import SparseRows, Trace

__all__ = [
    "Case", "EstimatorRunner", "Examples", "Expectation", "Implementation", "KerasRunner",
    "LoopRunner",
    "Mapped", "NameMap", "NameMapError", "PermuteRows", "Reshape", "RunRequest", "SparseIds",
    "SparseRows", "Tolerance", "Tolerances", "Trace", "Transpose", "compare_traces",
    "first_divergence", "attribute", "attribute_pair", "EmbeddingMLP", "OracleRunner",
]
