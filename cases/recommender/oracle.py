"""The recommender's oracle: its model and optimizer computed in float64 numpy.

`EmbeddingMLP` is the embedding + MLP click model of this case (forward and backward pass);
`OracleRunner` trains it with the harness's numpy optimizers (`verify.oracle_math`) and returns
the `Trace` a TF runner would, so it compares against the TF implementations like any other
implementation and reports can say which side departs from the math
(`verify.judge.attribution`).

Native names are canonical names: tables are `embedding/<table>`, layers `<layer>/kernel`,
`<layer>/bias`, slots `<variable>::<slot>` with the Keras slot names (`accumulator`, `m`, `v`,
`linear`).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Mapping, Sequence

import numpy as np

from verify.runners.capture.mutations import nudge_array
from verify.core.runner import RunRequest
from verify.core.names import NameMap
from verify.core.trace import SparseRows, Trace
from verify.oracle_math import (COMBINERS, SGD, batch_at, digests, embedding_lookup,
                                embedding_lookup_grad)


@dataclasses.dataclass(frozen=True)
class Embedded:
    """A sparse feature looked up in `embedding/<table>` with `combiner`."""

    feature: str
    table: str
    combiner: str

    def __post_init__(self):
        if self.combiner not in COMBINERS:
            raise ValueError(f"{self.feature}: combiner must be one of {COMBINERS}, "
                             f"got {self.combiner!r}")


@dataclasses.dataclass(frozen=True)
class DenseInput:
    """A dense feature fed as it is."""

    feature: str


@dataclasses.dataclass(frozen=True)
class EmbeddingMLP:
    """Concatenate `inputs` in order (the canonical row layout of the first kernel), then
    `layers` (name, activation "relu" or None) of Dense layers; the last gives the logit.
    `loss`: "sigmoid_cross_entropy" (mean over the batch, TF1
    `tf1.losses.sigmoid_cross_entropy`, Keras `BinaryCrossentropy(from_logits=True)`) or
    "mean_squared_error".

    >>> model = EmbeddingMLP((Embedded("ids", "t", "sum"), DenseInput("x")), (("out", None),))
    >>> model.variable_names()
    ['embedding/t', 'out/kernel', 'out/bias']
    """

    inputs: Sequence[Embedded | DenseInput]
    layers: Sequence[tuple[str, str | None]]
    loss: str = "sigmoid_cross_entropy"

    def tables(self) -> list[str]:
        return list(dict.fromkeys(f"embedding/{i.table}" for i in self.inputs
                                  if isinstance(i, Embedded)))

    def variable_names(self) -> list[str]:
        return self.tables() + [f"{name}/{part}" for name, _ in self.layers
                                for part in ("kernel", "bias")]

    def forward(self, params: Mapping[str, np.ndarray], batch: Mapping[str, Any],
                labels: np.ndarray):
        """Loss and the activations the backward pass needs."""
        dtype = next(iter(params.values())).dtype   # the oracle's precision
        blocks = []
        for item in self.inputs:
            if isinstance(item, Embedded):
                blocks.append(embedding_lookup(params[f"embedding/{item.table}"],
                                               batch[item.feature], item.combiner))
            else:
                blocks.append(np.asarray(batch[item.feature], dtype).reshape(len(labels), -1))
        activations = [np.concatenate(blocks, axis=1)]
        pre = []
        for name, activation in self.layers:
            z = activations[-1] @ params[f"{name}/kernel"] + params[f"{name}/bias"]
            pre.append(z)
            activations.append(np.maximum(z, 0.0) if activation == "relu" else z)
        logits, y = activations[-1], np.asarray(labels, dtype).reshape(activations[-1].shape)
        if self.loss == "sigmoid_cross_entropy":
            loss = np.mean(np.maximum(logits, 0) - logits * y + np.log1p(np.exp(-np.abs(logits))))
            dlogits = (1 / (1 + np.exp(-logits)) - y) / logits.size
        elif self.loss == "mean_squared_error":
            loss = np.mean((logits - y) ** 2)
            dlogits = 2 * (logits - y) / logits.size
        else:
            raise ValueError(f"unknown loss {self.loss!r}")
        return float(loss), (blocks, activations, pre, dlogits)

    def backward(self, params, batch, cache) -> dict[str, np.ndarray | SparseRows]:
        """Gradients of the loss: dense arrays, tables as `SparseRows` (summed over features)."""
        blocks, activations, pre, upstream = cache
        grads: dict[str, Any] = {}
        for n in range(len(self.layers) - 1, -1, -1):
            name, activation = self.layers[n]
            if activation == "relu":
                upstream = upstream * (pre[n] > 0)
            grads[f"{name}/kernel"] = activations[n].T @ upstream
            grads[f"{name}/bias"] = upstream.sum(axis=0)
            upstream = upstream @ params[f"{name}/kernel"].T
        offset = 0
        for item, block in zip(self.inputs, blocks):
            width = block.shape[1]
            if isinstance(item, Embedded):
                name = f"embedding/{item.table}"
                rows = embedding_lookup_grad(batch[item.feature], item.combiner,
                                             upstream[:, offset:offset + width],
                                             params[name].shape[0])
                grads[name] = _merge(grads.get(name), rows)
            offset += width
        return grads


def held_as_tensorflow_holds_it(optimizer):
    """`optimizer` with every float hyperparameter rounded to float32, as TensorFlow holds
    them (each is a float32 tensor): Adam's `1 - beta_2` is then 0.00099998713 (1 - float32(0.999))
    as in TF's kernel, not 0.001, a relative 1.3e-5 in every v that is no float noise.

    >>> from verify.oracle_math import Adam
    >>> held_as_tensorflow_holds_it(Adam(0.1)).beta_2 == float(np.float32(0.999))
    True
    """
    if not dataclasses.is_dataclass(optimizer):
        return optimizer
    return dataclasses.replace(optimizer, **{
        field.name: float(np.float32(getattr(optimizer, field.name)))
        for field in dataclasses.fields(optimizer)
        if isinstance(getattr(optimizer, field.name), float)})


def _merge(a: SparseRows | None, b: SparseRows) -> SparseRows:
    if a is None:
        return b
    ids = np.union1d(a.ids, b.ids)
    rows = np.zeros((len(ids), b.rows.shape[1]), b.rows.dtype)
    np.add.at(rows, np.searchsorted(ids, a.ids), a.rows)
    np.add.at(rows, np.searchsorted(ids, b.ids), b.rows)
    return SparseRows(ids, rows, b.dense_shape)


@dataclasses.dataclass(frozen=True)
class OracleRunner:
    """Trains `model` in numpy with `optimizer` (and `table_optimizer` for the embedding
    tables, default the same) and returns the Trace a TF runner would: step 0 the weights as
    loaded, step k the input digests, loss, gradients (tables as sparse rows), slots and
    weights after the update, and the eval loss on the first eval batch after the last step.
    Every value is computed in float64 (`dtype`) and recorded as float32; the optimizer's
    hyperparameters are taken as TensorFlow holds them, in float32
    (`held_as_tensorflow_holds_it`). An oracle with
    `dtype="float32"` computes the same math in float32: against the float64 one it measures
    the rounding of a float32 computation of the math (a calibration variant of the oracle).

    Use it as an implementation named "oracle" with `OracleRunner.names(model)`:

    >>> runner = OracleRunner(EmbeddingMLP((DenseInput("x"),), (("out", None),)), SGD(0.1))
    >>> sorted(runner.names().entries)
    ['out/bias', 'out/kernel']
    """

    uses_tensorflow = False   # numpy only: no TensorFlow state to start fresh

    model: EmbeddingMLP
    optimizer: Any
    table_optimizer: Any = None
    eval_steps: int = 1
    dtype: str = "float64"

    def names(self) -> NameMap:
        """The identity name map over the model's canonical variable names."""
        return NameMap({n: n for n in self.model.variable_names()})

    def describe(self) -> dict[str, Any]:
        out = {"api": f"numpy oracle ({self.dtype})", "optimizer": repr(self.optimizer)}
        if self.table_optimizer is not None:
            out["table_optimizer"] = repr(self.table_optimizer)
        return out

    def declared_config(self, case, implementation) -> dict[str, Any]:
        """The oracle declares no pipeline configuration: it is the math, not a pipeline."""
        return {}

    def math_config(self) -> dict[str, Any]:
        """The constants of the oracle's optimizers, keyed as pipelines declare them
        (`optimizer/model/epsilon`): not a configuration for preflight to compare, what the
        explanation stage (`verify.explain`) reads an update's constants against.

        >>> from verify.oracle_math import Adam
        >>> runner = OracleRunner(EmbeddingMLP((DenseInput("x"),), (("out", None),)), Adam(0.1))
        >>> runner.math_config()["optimizer/model/epsilon"]
        1e-08
        """
        out = {}
        for group, optimizer in (("model", self.optimizer), ("embedding", self.table_optimizer)):
            if optimizer is None:
                continue
            out[f"optimizer/{group}/kind"] = type(optimizer).__name__.lower()
            for field in dataclasses.fields(optimizer):
                value = getattr(optimizer, field.name)
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    name = {"l1": "l1_regularization_strength",
                            "l2": "l2_regularization_strength"}.get(field.name, field.name)
                    out[f"optimizer/{group}/{name}"] = float(value)
        for feature in self.model.inputs:
            if isinstance(feature, Embedded):
                out[f"table/embedding/{feature.table}/combiner"] = feature.combiner
        return out

    def _optimizer_for(self, name: str):
        if name.startswith("embedding/") and self.table_optimizer is not None:
            return held_as_tensorflow_holds_it(self.table_optimizer)
        return held_as_tensorflow_holds_it(self.optimizer)

    def run(self, request: RunRequest) -> Trace:
        case, model = request.case, self.model
        names = model.variable_names()
        missing = sorted(set(names) - set(request.initial_values))
        if missing:
            raise ValueError(f"the oracle needs initial values for {missing}")
        params = {n: np.asarray(request.initial_values[n], self.dtype) for n in names}
        slots = {n: self._optimizer_for(n).init_slots(params[n]) for n in names}
        trace = request.trace
        for n in names:
            trace.record(0, "weight", n, params[n].astype(np.float32))
        started = time.perf_counter()
        for step in range(1, request.steps + 1):
            batch, labels = batch_at(case.examples, step, case.batch_size)
            for name, d in digests(batch, labels).items():
                trace.record(step, "input", name, d)
            loss, cache = model.forward(params, batch, labels)
            grads = model.backward(params, batch, cache)
            trace.record(step, "loss", "loss", np.float32(loss))
            mutation = request.implementation.mutation
            if mutation is not None and mutation.kind != "nudge_gradients":
                raise NotImplementedError(f"the oracle applies only nudge_gradients mutations, "
                                          f"not {mutation.kind}")
            for index, n in enumerate(names):
                g, optimizer = grads[n], self._optimizer_for(n)
                if mutation is not None:   # float32-sized noise on the float64 math
                    seed = (step, index)
                    g = (SparseRows(g.ids, nudge_array(g.rows, seed), g.dense_shape)
                         if isinstance(g, SparseRows) else nudge_array(g, seed))
                if isinstance(g, SparseRows):
                    trace.record(step, "grad", n, SparseRows(g.ids, g.rows.astype(np.float32),
                                                             g.dense_shape))
                    params[n], slots[n] = optimizer.apply(params[n], g.rows, slots[n], step,
                                                          rows=g.ids)
                else:
                    trace.record(step, "grad", n, g.astype(np.float32))
                    params[n], slots[n] = optimizer.apply(params[n], g, slots[n], step)
            for n in names:
                trace.record(step, "weight", n, params[n].astype(np.float32))
                for slot, value in slots[n].items():
                    trace.record(step, "slot", f"{n}::{slot}", value.astype(np.float32))
        if case.eval_examples is not None:
            losses = [model.forward(params, *batch_at(case.eval_examples, k, case.batch_size))[0]
                      for k in range(1, self.eval_steps + 1)]
            trace.record(request.steps, "metric", "eval/loss", np.float32(np.mean(losses)))
        trace.meta.replicas = 1
        trace.meta.details.update({"strategy": "numpy", "dtype": self.dtype,
                                   "math_config": self.math_config(),
                           "train_seconds": round(time.perf_counter() - started, 3)})
        return trace
