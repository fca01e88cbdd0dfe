"""Keras 3 + keras-rs on a TPU: the TensorFlow backend under `TPUStrategy`, the JAX backend on
JAX's TPU devices; tables on a SparseCore moved to and from the host by their own API.

What runs where:

- **TensorFlow backend** (`keras3-tf`): the model is built and trained under `TPUStrategy`
  (`verify.runners.capture.tpu.tpu_strategy`, one core per replica). The taps are the CPU
  ones (`verify.runners.keras3.taps`); each send goes through `host_transfer`
  (`tf.tpu.outside_compilation`), as the Keras 2 TPU path does.
- **JAX backend** (`keras3-jax`): Keras 3 places the model on JAX's default device, the first
  TPU core (`verify.runners.capture.tpu.jax_tpu_devices` checks there is one). The taps'
  `jax.debug.callback` reaches the host on a TPU as on CPU.
- **Tables on a SparseCore** (placement "auto" on a chip with SparseCores, or "sparsecore")
  have no Keras variable: `EngineTables` moves them, by the path their variable has on the
  default device (`distributed_embedding/<table>/embeddings`, so the CPU name maps hold).
  TensorFlow: through checkpoints of the mid-level engine object, into and out of its CPU
  counterpart `TPUEmbeddingForServing`, built in a thread where no strategy is in force from
  the tables' own (unpadded) configs; a `TPUEmbedding` (v1) engine is pushed to the TPU after
  a load (saving it retrieves from the TPU by itself). Tables and slots from a v1 engine,
  tables only from a `TPUEmbeddingV2` (its checkpoint unstacks into parameters only). JAX:
  keras-rs' `set_embedding_tables` / `get_embedding_tables` (tables; no slots: keras-rs offers
  no way to read them), keras-rs' own stacked table, slot and counter variables left out of
  the model's. The engine applies a table's gradient itself, so table gradients are declared
  not captured; the tables (and v1's slots) are read every K steps (`--tpu-tables-every`).
- Tables placed on the default device are ordinary Keras variables on the TPU and are
  captured every step like the dense ones.

With the stand-ins the tests use (the default strategy for `TPUStrategy`, CPU devices for
JAX's TPU ones) the same code runs on CPU; keras-rs then places every table on the default
device, so `EngineTables` is exercised on CPU only through the mid-level objects (a CPU
`TPUEmbedding` standing for the TPU one).
"""
from __future__ import annotations

import concurrent.futures
from pathlib import Path
from typing import Any, Callable

import numpy as np

from verify.core.quantities import GRAD, SLOT, WEIGHT
from verify.core.runner import RunRequest, UnsupportedRequest
from verify.runners.capture.keras3_internals import (
    KERAS3_SLOT_OF_ENGINE_SLOT, all_layers, default_device_path, engine_tables,
    is_distributed_embedding, is_stacked_engine, jax_engine_variables, load_into_engine,
    sync_jax_state, tf_engine, tf_engine_feature_configs, tf_engine_twin,
    tpu_table_optimizer)
from verify.runners.capture.step_record import StepRecorder

TABLE_GRADIENT_IN_ENGINE = (
    "a keras-rs table on a SparseCore is trained by the TPU embedding engine, which applies "
    "the table's gradient itself (keras-rs' gradient trap hands it the gradient of the "
    "activations); it never exists as a tensor the host can see")
TABLE_SLOTS_UNREAD = (
    "the optimizer slots of a SparseCore table are not read back: keras-rs on JAX reads "
    "tables only (get_embedding_tables), and TPUEmbeddingForServing unstacks a "
    "TPUEmbeddingV2 checkpoint into parameters only")


def tpu_strategy_for(backend: str, request: RunRequest):
    """The strategy a Keras 3 run on `request.device` builds and trains under: `TPUStrategy` on
    one core per replica (TensorFlow on a TPU), None elsewhere (CPU; JAX, whose TPU devices
    are checked here: Keras 3 places the model on the first)."""
    if request.device != "tpu":
        return None
    from verify.runners.capture import tpu

    if request.layers is not None:
        raise UnsupportedRequest(f"{request.implementation.name}: a layer replay runs on CPU "
                                 f"only; drop --tpu or --replay-layers")
    replicas = request.implementation.replicas
    if backend == "jax":
        tpu.jax_tpu_devices(replicas)
        return None
    return tpu.tpu_strategy(request.tpu_name, replicas=replicas)


class EngineTables:
    """The tables a Keras 3 model keeps in the TPU embedding engine, by the path their variable
    has on the default device. `load(values)` puts values into the engine, `read()` returns
    (tables, slots) from it, slots as `path::slot` in Keras 3's slot names.

    >>> engine = EngineTables(model, "tensorflow", Path("/tmp/engine"))  # doctest: +SKIP
    >>> engine.load({"distributed_embedding/t/embeddings": table}); tables, slots = engine.read()
    ... # doctest: +SKIP
    """

    def __init__(self, model, backend: str, directory: Path):
        self.backend, self.directory = backend, Path(directory)
        self.tables: dict[str, tuple[Any, Any]] = {}   # path -> (layer, TableConfig)
        for layer in filter(is_distributed_embedding, all_layers(model)):
            for table in engine_tables(layer):
                self.tables[default_device_path(layer, table)] = (layer, table)
        self.reads = 0
        self._configs: dict[int, Any] = {}   # id(layer) -> the twin's feature configs

    def __bool__(self) -> bool:
        return bool(self.tables)

    def shapes(self) -> dict[str, tuple]:
        return {path: (table.vocabulary_size, table.embedding_dim)
                for path, (_, table) in self.tables.items()}

    def own_variables(self) -> set[int]:
        """ids of the variables keras-rs keeps for the engine's tables among the model's
        trainable ones (JAX: the stacked tables, their slots, a step counter): no canonical
        name maps to them."""
        if self.backend != "jax":
            return set()
        return {id(v) for layer, _ in self._by_layer().values()
                for v in jax_engine_variables(layer)}

    def reads_slots(self) -> bool:
        """Whether `read` returns the tables' slots: on TensorFlow with a `TPUEmbedding` (v1)
        engine. Not on JAX (keras-rs reads tables only) nor from a `TPUEmbeddingV2`, whose
        stacked checkpoint `TPUEmbeddingForServing` unstacks into parameters only."""
        return self.backend != "jax" and not any(
            is_stacked_engine(tf_engine(layer)[0]) for layer, _ in self._by_layer().values())

    def slot_names(self) -> dict[str, list[str]]:
        """Table path -> the Keras 3 names of the slots its TPU optimizer keeps."""
        return {path: [KERAS3_SLOT_OF_ENGINE_SLOT.get(s, s)
                       for s in tpu_table_optimizer(table.optimizer)._slot_names()]
                for path, (_, table) in self.tables.items()}

    def _twin_configs(self, layer) -> Any:
        """The CPU twin's feature configs for `layer`, converted once per run."""
        if id(layer) not in self._configs:
            self._configs[id(layer)] = tf_engine_feature_configs(layer)
        return self._configs[id(layer)]

    def _by_layer(self) -> dict[int, tuple[Any, dict[str, str]]]:
        """id(layer) -> (layer, table name -> path)."""
        out: dict[int, tuple[Any, dict[str, str]]] = {}
        for path, (layer, table) in self.tables.items():
            out.setdefault(id(layer), (layer, {}))[1][table.name] = path
        return out

    def load(self, values: dict[str, np.ndarray]) -> None:
        for number, (layer, paths) in enumerate(self._by_layer().values()):
            mine = {name: values[path] for name, path in paths.items() if path in values}
            if self.backend == "jax":
                if not hasattr(layer, "set_embedding_tables"):
                    raise RuntimeError(
                        "keras-rs on JAX places a table on a SparseCore only with "
                        "jax-tpu-embedding installed, and its layer then sets tables with "
                        "set_embedding_tables; this layer has none: add jax[tpu] and "
                        "jax-tpu-embedding to the environment's requirements")
                layer.set_embedding_tables(mine)
                continue
            import tensorflow as tf

            self.directory.mkdir(parents=True, exist_ok=True)
            engine, optimizer = tf_engine(layer)
            configs = self._twin_configs(layer)
            saved = outside_strategy(lambda: _twin_checkpoint(
                configs, optimizer, mine, str(self.directory / f"load-{number}")))
            tf.train.Checkpoint(embedding=engine).read(saved).assert_existing_objects_matched()
            load_into_engine(engine)

    def read(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        tables: dict[str, np.ndarray] = {}
        slots: dict[str, np.ndarray] = {}
        for number, (layer, paths) in enumerate(self._by_layer().values()):
            if self.backend == "jax":
                read = layer.get_embedding_tables()
                tables.update({path: np.asarray(read[name]) for name, path in paths.items()})
                continue
            import tensorflow as tf

            self.directory.mkdir(parents=True, exist_ok=True)
            engine, optimizer = tf_engine(layer)
            configs = self._twin_configs(layer)
            saved = tf.train.Checkpoint(embedding=engine).write(
                str(self.directory / f"read-{number}"))
            restored = outside_strategy(lambda: _restored_twin(configs, optimizer, saved))
            for name, path in paths.items():
                for slot, value in _by_table_name(restored)[name].items():
                    if slot == "parameters":
                        tables[path] = value
                    else:
                        slots[f"{path}::{KERAS3_SLOT_OF_ENGINE_SLOT.get(slot, slot)}"] = value
        self.reads += 1
        return tables, slots


def outside_strategy(computation: Callable[[], Any]) -> Any:
    """`computation()` where no distribution strategy is in force: in a thread of its own
    (TensorFlow keeps the strategy scope per thread). The CPU twin refuses to be created under
    `TPUStrategy`, and the engine is read from inside `fit`, which runs in the strategy's
    scope."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(computation).result()


def _twin_checkpoint(configs, optimizer, values: dict[str, np.ndarray], prefix: str) -> str:
    """A CPU twin holding `values` (table name -> array; other tables keep their initializer's
    values), written as a checkpoint; its path."""
    import tensorflow as tf

    twin = tf_engine_twin(configs, optimizer)
    for name, variables in _by_table_name(twin.variables).items():
        if name in values:
            variables["parameters"].assign(values[name])
    return tf.train.Checkpoint(embedding=twin).write(prefix)


def _restored_twin(configs, optimizer, saved: str) -> dict:
    """The values of a fresh `TPUEmbeddingForServing` restored from `saved` (table name ->
    {"parameters" or engine slot: array}), every one of its variables matched (else
    AssertionError: a read that matched nothing would hand over the twin's own initial
    values). Restored before it builds, as TensorFlow documents for a SparseCore checkpoint:
    the twin then builds the unstacked tables the checkpoint's layouts describe."""
    import tensorflow as tf

    twin = tf_engine_twin(configs, optimizer)
    status = tf.train.Checkpoint(embedding=twin).read(saved)
    variables = twin.variables   # builds it, restoring as it creates each variable
    status.assert_existing_objects_matched()
    return {name: {slot: v.numpy() for slot, v in of_table.items()}
            for name, of_table in _by_table_name(variables).items()}


def _by_table_name(variables) -> dict[str, dict[str, Any]]:
    """A mid-level object's `variables` keyed by table name (TensorFlow keys them by name or
    by `TableConfig`, depending on the class)."""
    return {getattr(key, "name", key): value for key, value in variables.items()}


def engine_reads(engine: EngineTables, trace, steps: int, every: int, model=None):
    """`at_step(step)`: read the engine's tables (and slots) into `trace` at every `every`-th
    step and the last; on JAX the training state is written back to the variables first."""
    recorder = StepRecorder(trace)

    def at_step(step: int) -> None:
        if step % every and step != steps:
            return
        if model is not None:
            sync_jax_state(model)
        tables, slots = engine.read()
        recorder.weights(step, tables)
        recorder.slots(step, slots)

    return at_step


def declare_engine_reads(engine: EngineTables, trace, every: int, captured: bool) -> None:
    """Tell the judge what the trace holds of the engine's tables: read every `every` steps,
    their gradients not captured (a captured run), and their slots read with them or, where
    they cannot be read (JAX, `TPUEmbeddingV2`), declared not captured."""
    reads_slots, recorder = engine.reads_slots(), StepRecorder(trace)
    for path, slots in engine.slot_names().items():
        recorder.read_every(WEIGHT, path, every)
        if captured:
            recorder.not_captured(GRAD, path, TABLE_GRADIENT_IN_ENGINE)
        for slot in slots:
            if reads_slots:
                recorder.read_every(SLOT, f"{path}::{slot}", every)
            else:
                recorder.not_captured(SLOT, f"{path}::{slot}", TABLE_SLOTS_UNREAD)
