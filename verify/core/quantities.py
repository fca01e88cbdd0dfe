"""The quantities a trace holds, in one table: their order, kind, colour and default tolerance.

Adding a quantity means adding a row here (and capturing it in a runner); every stage after
the trace (comparison order, tolerances, reports, plots) reads this table.

The default tolerances were measured on a 2-core x86-64 CPU, TF 2.15.1, float32, on the
faithful pairs of the `tpu_embedding` case (tf1 against tf2, tf2-mirrored with 2 replicas and
the steps_per_execution=10 runs, 20 steps); the figure each came from is in `measured`.

>>> [q.name for q in QUANTITIES if q.numeric]
['loss', 'grad', 'slot', 'weight', 'metric']
>>> ORDER["input"] < ORDER["loss"] < ORDER["weight"]
True
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Quantity:
    """One kind of captured value."""

    name: str
    meaning: str
    numeric: bool            # compared element-wise (else: digests or structural rows only)
    atol: float              # default tolerance
    rtol: float
    measured: str            # the drift the default was set from
    colour: str = "#666666"  # in report.html's plots
    per_variable: bool = False   # one value per variable (or var::slot), renamed by name maps


# Checked in this order within a step: a data problem (input) shows before a model problem
# (loss, grad) before an optimizer problem (slot, weight).
QUANTITIES: tuple[Quantity, ...] = (
    Quantity("run", "a run that raised, or a step it should have captured and did not", False,
             0.0, 0.0, "a run that raised fails whatever the tolerance"),
    Quantity("input", "every feature and the label of the batch a step consumed, per example "
             "in canonical form (verify.core.inputs)", False, 0.0, 0.0,
             "examples are equal or not"),
    Quantity("loss", "the loss the step minimized (before the update)", True, 1e-6, 1e-5,
             "6.0e-8 abs on a loss of 0.69, 2.7e-7 rel", "#1f77b4"),
    Quantity("grad", "the gradient of every trainable variable, aggregated over replicas",
             True, 1e-6, 1e-4, "2.4e-7 abs on a kernel gradient of max |g| 2.2; 2.1e-5 rel on an "
             "element of 2.2e-4 (the atol alone is 4x the worst absolute drift)", "#ff7f0e", per_variable=True),
    Quantity("slot", "optimizer slots after the update", True, 1e-6, 1e-4,
             "1.9e-6 abs on an accumulator of max 14.2, 1.7e-7 rel", "#2ca02c",
             per_variable=True),
    Quantity("weight", "every variable after the update; step 0 holds the values as loaded",
             True, 1e-6, 1e-5, "6.7e-8 abs, 3.0e-5 rel on an element of -2.0e-3", "#9467bd",
             per_variable=True),
    Quantity("metric", "evaluation loss and other metrics", True, 1e-6, 1e-5,
             "eval loss 1.5e-8 abs, 1.2e-7 rel", "#8c564b"),
)
BY_NAME = {q.name: q for q in QUANTITIES}
NAMES = tuple(q.name for q in QUANTITIES)
ORDER = {q.name: n for n, q in enumerate(QUANTITIES)}
NUMERIC = tuple(q.name for q in QUANTITIES if q.numeric)
PER_VARIABLE = tuple(q.name for q in QUANTITIES if q.per_variable)


def check_quantity(name: str) -> str:
    """`name` if it is a known quantity, else a ValueError listing the known ones."""
    if name not in BY_NAME:
        raise ValueError(f"unknown quantity {name!r}; expected one of {NAMES}")
    return name


# Each quantity by name, for the code that captures it: `verify/runners` writes none of these
# names as a literal (tests/project/test_one_trace_writer.py), and a name the table lacks fails
# here, on import.
RUN = check_quantity("run")
INPUT = check_quantity("input")
LOSS = check_quantity("loss")
GRAD = check_quantity("grad")
SLOT = check_quantity("slot")
WEIGHT = check_quantity("weight")
METRIC = check_quantity("metric")
