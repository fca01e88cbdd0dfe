"""A fresh process's sequence of runs for tests/runners/test_run_isolation.py (run as a script).

    python tests/isolation_run.py KIND OUT.json

KIND is keras, loop or estimator. In one process: the victim run first (the same run in a
fresh process), then a polluting run (sets a mixed_bfloat16 policy, floatx float64 and XLA JIT
and never restores them), the victim again, a polluter again, and the victim once more with
the suite's reset switched off (the negative control). Writes each victim run's digest and
what the suite reset after each polluter.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import sys

import numpy as np


@dataclasses.dataclass(frozen=True)
class Polluting:
    """A user's runner that changes process-wide state before running as usual."""

    inner: object

    def run(self, request):
        import tensorflow as tf

        tf.keras.mixed_precision.set_global_policy("mixed_bfloat16")
        tf.keras.backend.set_floatx("float64")
        tf.config.optimizer.set_jit(True)
        return self.inner.run(request)

    def describe(self):
        return {"api": "polluting", "runner": self.inner.describe()}

    def declared_config(self, case, implementation):
        return {}


def victim(kind: str):
    if kind == "loop":   # the custom-loop case on a tiny synthetic set (it trains whole epochs)
        from tiny_loop import tiny_loop_case

        case = tiny_loop_case()
        return case, case.implementation("reference-x1"), 2
    from cases.tpu_embedding import CASE

    return CASE, CASE.implementation("tf2" if kind == "keras" else "tf1"), 3


def fingerprint(trace) -> str:
    from verify.core.inputs import InputFeature
    from verify.core.trace import as_dense

    if trace.error:
        return f"error: {trace.error.splitlines()[0]}"
    h = hashlib.sha256()
    for key in sorted(trace.values, key=lambda k: (k.step, k.quantity, k.tensor)):
        value = trace.values[key]
        h.update(key.encode().encode())
        if isinstance(value, str):
            h.update(value.encode())
        elif isinstance(value, InputFeature):    # an input: its canonical per-example form
            h.update(value.layout.encode())
            for array in value.arrays().values():
                h.update(np.ascontiguousarray(array).tobytes())
        else:
            h.update(np.ascontiguousarray(as_dense(value)).tobytes())
    return h.hexdigest()


def main(kind: str, out: str) -> None:
    from verify.runners import run as run_module
    from verify.runners.capture.devices import configure_cpu_replicas

    configure_cpu_replicas()
    case, implementation, steps = victim(kind)
    polluter = dataclasses.replace(implementation, name="polluter",
                                   runner=Polluting(implementation.runner))

    def run(impl):
        return run_module.run_implementation(case, impl, steps=steps)

    fresh = fingerprint(run(implementation))
    reset = run(polluter).meta.details.get("process_state_reset", [])
    isolated = fingerprint(run(implementation))
    run_module.starting_fresh = lambda: []   # the negative control: no reset
    run(polluter)
    unisolated = fingerprint(run(implementation))
    with open(out, "w") as f:
        json.dump({"fresh": fresh, "isolated": isolated, "unisolated": unisolated,
                   "reset": reset}, f)


if __name__ == "__main__":
    main(*sys.argv[1:])
