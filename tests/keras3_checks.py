"""What `tests/runners/keras3/test_keras3_runner.py` checks inside a keras3 environment (it runs this file
with that environment's Python and KERAS_BACKEND); prints one JSON document.

- capture: each keras3 implementation trained with and without capture; which weights and
  slots differ (they must not), how many were compared, and whether training moved them;
- declared: the declared configuration of the faithful rewrite and of the preflight controls;
- unsupported: how a table optimizer the TPU engine cannot run is declared.
"""
import json
import sys

import numpy as np


def capture_check(case, name: str) -> dict:
    from verify.core.trace import Key
    from verify.runners.run import run_implementation

    implementation = case.implementation(name)
    captured = run_implementation(case, implementation, capture_steps=True)
    plain = run_implementation(case, implementation, capture_steps=False)
    state = [k for k in plain.values if k.quantity in ("weight", "slot") and k.step > 0]
    different = [f"{k.step} {k.quantity} {k.tensor}" for k in state
                 if k not in captured.values
                 or not np.array_equal(np.asarray(captured.values[k]), np.asarray(plain.values[k]))]
    last = max(k.step for k in state) if state else 0
    moved = [k.tensor for k in state if k.step == last and k.quantity == "weight"
             and not np.array_equal(np.asarray(plain.values[k]),
                                    np.asarray(plain.values[Key(0, "weight", k.tensor)]))]
    return {"errors": [captured.error, plain.error], "captured_steps": captured.steps(),
            "compared": len(state), "different": different, "moved": moved,
            "quantities": sorted({k.quantity for k in captured.values}),
            "seconds": [captured.meta.seconds, plain.meta.seconds]}


def main(suffix: str) -> None:
    from cases.recommender import make_case
    from cases.tpu_embedding import CASE
    from verify.runners.keras3.runner import describe_table_optimizer
    from verify.runners.run import declared_config

    adam = make_case("adam")
    report = {
        "capture": {"tpu_embedding": capture_check(CASE, f"keras3-{suffix}"),
                    "recommender_adam": capture_check(adam, f"keras3-{suffix}")},
        "declared": {name: declared_config(CASE, CASE.implementation(name))
                     for name in (f"keras3-{suffix}", "control-keras-rs-table-optimizer",
                                  "control-keras-rs-initializer")},
    }
    import keras

    report["unsupported"] = describe_table_optimizer(keras.optimizers.Adagrad(epsilon=0.0),
                                                     "optimizer/embedding")
    print("KERAS3-CHECKS " + json.dumps(report, default=str))


if __name__ == "__main__":
    main(sys.argv[1])
