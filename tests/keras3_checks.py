"""What `tests/runners/keras3/test_keras3_runner.py` checks inside a keras3 environment (it runs this file
with that environment's Python and KERAS_BACKEND); prints one JSON document.

- capture: each keras3 implementation trained with and without capture; which weights and
  slots differ (they must not), how many were compared, and whether training moved them;
- declared: the declared configuration of the faithful rewrite and of the preflight controls;
- unsupported: how a table optimizer the TPU engine cannot run is declared;
- tpu: the `--tpu` path with CPU stand-ins (the default strategy for `TPUStrategy`, CPU
  devices for JAX's TPU ones) against the CPU run, value by value; and `EngineTables` moving a
  table and its slots into and out of a mid-level embedding object (TensorFlow: a CPU
  `TPUEmbedding` standing for the TPU one; JAX: keras-rs' own table setter and getter).
"""
import contextlib
import json
import sys
import tempfile

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


def _equal(a, b) -> bool:
    """Bitwise equality of two trace values: arrays, or sparse rows (ids, rows, shape)."""
    if hasattr(a, "ids"):
        return (hasattr(b, "ids") and np.array_equal(a.ids, b.ids)
                and np.array_equal(a.rows, b.rows) and a.dense_shape == b.dense_shape)
    return np.array_equal(np.asarray(a), np.asarray(b))


def tpu_standin_check(case, name: str, backend: str) -> dict:
    """The faithful rewrite run as `--tpu` runs it, with the stand-ins, against its CPU run."""
    from unittest import mock

    from verify.runners.capture import tpu
    from verify.runners.run import run_implementation

    implementation = case.implementation(name)
    cpu = run_implementation(case, implementation, capture_steps=True)
    if backend == "tf":
        import tensorflow as tf

        standin = mock.patch.object(tpu, "tpu_strategy",
                                    lambda name="", replicas=None: tf.distribute.get_strategy())
    else:
        import jax

        standin = mock.patch.object(tpu, "jax_tpu_devices",
                                    lambda replicas=1: jax.devices("cpu")[:replicas])
    with standin:
        on_tpu = run_implementation(case, implementation, capture_steps=True, device="tpu")
        if backend == "tf":   # control: a send that never reaches the host must fail the run
            with mock.patch.object(tpu, "host_transfer", lambda computation, *args: None):
                lost = run_implementation(case, implementation, capture_steps=True,
                                          device="tpu").error
    different = sorted(f"{k.step} {k.quantity} {k.tensor}" for k in cpu.values
                       if k not in on_tpu.values or not _equal(cpu.values[k], on_tpu.values[k]))
    return {"errors": [cpu.error, on_tpu.error], "compared": len(cpu.values),
            "extra": sorted(f"{k}" for k in on_tpu.values if k not in cpu.values),
            "different": different, "strategy": on_tpu.meta.details.get("strategy"),
            "lost_sends_error": lost if backend == "tf" else None}


class _TableSetterStandIn:
    """keras-rs' JAX `DistributedEmbedding` as `EngineTables` uses it: tables set and got by
    table name (`set_embedding_tables`, `get_embedding_tables`)."""

    def __init__(self):
        self.tables = {}

    def set_embedding_tables(self, tables):
        self.tables.update({name: np.asarray(value) for name, value in tables.items()})

    def get_embedding_tables(self):
        return dict(self.tables)


def engine_check(backend: str, workdir: str) -> dict:
    """`EngineTables.load` then `read` on a mid-level object (see the module docstring): what
    is read back must be what was loaded, and a training-like change to the object must show.
    On TensorFlow the reads run inside a strategy's scope, as they do inside `fit` (the CPU
    twin is built outside it), and the v1 engine's load and retrieve hooks are counted."""
    import types
    from pathlib import Path

    import keras
    import keras_rs

    from verify.runners.keras3.tpu import EngineTables, outside_strategy

    keras.backend.clear_session()
    table = keras_rs.layers.TableConfig(name="t", vocabulary_size=6, embedding_dim=3,
                                        optimizer=keras.optimizers.Adagrad(0.1))
    feature = keras_rs.layers.FeatureConfig(name="f", table=table, input_shape=(2, 1),
                                            output_shape=(2, 3))
    path = "distributed_embedding/t/embeddings"
    hooks = {"load": 0, "retrieve": 0}
    scope = contextlib.nullcontext
    if backend == "jax":   # keras-rs' JAX layer (it needs jax-tpu-embedding) sets and gets by name
        layer = _TableSetterStandIn()
    else:                  # keras-rs' TF layer on a SparseCore, its engine a CPU TPUEmbedding
        import tensorflow as tf

        from verify.runners.keras3.tpu import tf_engine_twin

        configs = {"f": tf.tpu.experimental.embedding.FeatureConfig(
            table=tf.tpu.experimental.embedding.TableConfig(vocabulary_size=6, dim=3, name="t"),
            name="f")}
        optimizer = tf.tpu.experimental.embedding.Adagrad(0.1, initial_accumulator_value=0.1)
        cpu_engine = tf.tpu.experimental.embedding.TPUEmbedding(configs, optimizer)
        cpu_engine.build()   # as keras-rs' _sparsecore_build builds the TPU one
        for hook in ("load", "retrieve"):
            original = getattr(cpu_engine, f"_{hook}_variables")

            def counted(hook=hook, original=original):
                hooks[hook] += 1
                return original()
            setattr(cpu_engine, f"_{hook}_variables", counted)
        layer = types.SimpleNamespace(
            _placement_to_path_to_feature_config={"sparsecore": {"f": feature}},
            _using_keras_rs_configuration=True, _tpu_embedding=cpu_engine,
            _tpu_optimizer=optimizer, path="distributed_embedding")
        fresh = tf_engine_twin(configs, optimizer)   # never restored: its own initial values
        strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
        scope = strategy.scope
    engine = EngineTables(keras.Sequential(), backend, Path(workdir))
    engine.tables = {path: (layer, table)}   # as if keras-rs had placed it on a SparseCore
    loaded = np.arange(18, dtype=np.float32).reshape(6, 3) / 7
    engine.load({path: loaded})
    after_load, slots_after_load = engine.read()
    out = {"loaded_read_back": bool(np.array_equal(after_load[path], loaded)),
           "slots": sorted(slots_after_load), "reads_slots": engine.reads_slots()}
    if backend == "jax":
        layer.tables["t"] = layer.tables["t"] * 2
        out["trained_read_back"] = bool(np.array_equal(engine.read()[0][path], loaded * 2))
    else:
        variables = cpu_engine._variables["t"]
        variables["parameters"].assign(variables["parameters"] * 2)
        variables["accumulators"].assign(variables["accumulators"] + 1)
        with scope():   # as inside fit
            tables, slots = engine.read()
            out["strategy_outside"] = outside_strategy(tf.distribute.has_strategy)
            out["strategy_inside"] = tf.distribute.has_strategy()
        out["trained_read_back"] = bool(np.array_equal(tables[path], loaded * 2))
        out["slot_read_back"] = bool(np.allclose(slots[f"{path}::accumulator"], 1.1))
        out["stale_twin_differs"] = not np.array_equal(
            fresh.embedding_tables[next(iter(fresh.embedding_tables))].numpy(), loaded)
    out["reads"], out["hooks"] = engine.reads, hooks
    return out


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

    report["tpu"] = {"standin": tpu_standin_check(CASE, f"keras3-{suffix}", suffix),
                     "engine": engine_check("jax" if suffix == "jax" else "tensorflow",
                                            tempfile.mkdtemp(prefix="parity-engine-"))}
    report["unsupported"] = describe_table_optimizer(keras.optimizers.Adagrad(epsilon=0.0),
                                                     "optimizer/embedding")
    print("KERAS3-CHECKS " + json.dumps(report, default=str))


if __name__ == "__main__":
    main(sys.argv[1])
