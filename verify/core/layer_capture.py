"""What a layer replay observed of one training step, layer by layer, TensorFlow-free.

A replay (`verify.session.layer_replay`) runs one side of a pair again up to the step where the pair
first diverged, with `verify.runners.capture.layer_taps` observing every Keras layer call of
that step: the input and the output of each layer that holds trainable variables, the
per-example loss of a Keras `Loss`, and the gradient of the step's loss with respect to each.
`LayerRecorder` is the host side of those taps: it keeps the values of the one step asked for,
by replica. `LayerRecorder.capture(names)` turns them into a `LayerCapture` in canonical names:

- a layer is named by the canonical variables it holds (`dense/kernel` and `dense/bias`: layer
  `dense`), so the two sides' layers meet through the name maps a case already has;
- a layer called several times in the step (gradient accumulation over chunks, a shared tower)
  and the replicas of one call are joined along the batch axis, call by call, replica by
  replica within a call, so one device and N replicas give the same global-batch values;
- a layer input that meets a kernel whose rows the name map permutes (`PermuteRows`) has its
  last axis permuted the same way, so a `[dense, embedding]` concatenation meets a
  `[embedding, dense]` one;
- a layer without variables (a concatenation, a pooling) is not compared itself: it is named as
  what feeds the next layer with variables when its output is that layer's input
  (`fed_by`), and listed in `unobserved` otherwise.

>>> recorder = LayerRecorder(step=1)
>>> recorder.describe(0, LayerCall("Dense", "dense", ("dense/kernel", "dense/bias")))
>>> recorder.take(1, {0: {"0:output": np.ones((2, 1), np.float32)}})
>>> from verify.core.names import NameMap
>>> capture = recorder.capture(NameMap({"dense/kernel": "dense/kernel", "dense/bias": "dense/bias"}))
>>> [(e.layer, e.kind, e.forward.shape) for e in capture.entries]
[('dense', 'output', (2, 1))]
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np

from verify.core.names import NameMap, PermuteRows

KINDS = ("input", "output", "per-example loss")
LAYER_INPUT, LAYER_OUTPUT, PER_EXAMPLE_LOSS = KINDS   # what of a layer a value is
GRAD = ":grad"   # suffix of the name a value's gradient is sent under


@dataclasses.dataclass(frozen=True)
class LayerCall:
    """One observed call, as the taps saw it when the step's function was traced.

    `variables` are the native names of the trainable variables the layer holds (none for a
    Keras loss); `fed_by` the class of the variable-free layer whose output is this call's
    input ("" when none is)."""

    layer_class: str
    layer_name: str
    variables: tuple[str, ...]
    fed_by: str = ""
    loss: bool = False
    # a feature-column layer's features, in the order it concatenates them (its output's
    # gradient is split by them); () for any other layer
    parts: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class ObservedLayer:
    """One value of the replayed step, in canonical terms: `layer` (named by its canonical
    variables, or "loss"), `kind` (input, output or per-example loss), `order` (forward order on
    this side), the value (`forward`) and the gradient of the step's loss with respect to it
    (`backward`, None where the value is not on the gradient's path)."""

    layer: str
    kind: str
    order: int
    layer_class: str
    fed_by: str
    forward: np.ndarray
    backward: np.ndarray | None
    part: str = ""   # the feature of a layer whose output is one tensor per feature

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.layer, self.kind, self.part)


@dataclasses.dataclass(frozen=True)
class LayerCapture:
    """A side's replayed step: its observed values in forward order, and the variable-free
    layers it saw but could not compare (`unobserved`: "Flatten flatten (no variables; its
    output is no observed layer's input)")."""

    step: int
    entries: tuple[ObservedLayer, ...]
    unobserved: tuple[str, ...] = ()
    replicas: int = 1
    # canonical layer -> the side's live layer object of its first call (opaque here: only a
    # layer substitution, `verify.runners.capture.substitution`, calls it, after the run)
    units: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)

    def by_key(self) -> dict[tuple[str, str, str], ObservedLayer]:
        return {e.key: e for e in self.entries}


class StepSeen(Exception):
    """Raised by the capture once a replay's step is complete, to end a run that cannot be
    asked to stop there (a custom loop runs whole epochs): the runner that asked ends its run
    normally, with the steps captured so far."""


class LayerRecorder:
    """Host side of the layer taps: keeps the values of step `step` (1-based, the optimizer
    step the run's capture numbers), by replica. `stop_after_step`: the capture raises
    `StepSeen` once it holds them (set by a runner that catches it).

    The graph side `describe`s each call it observes (an index in call order) when it traces
    the step, and sends values named `"<index>:<kind>"` (the gradient: `"<index>:<kind>:grad"`);
    the step's capture hands them over with `take` once the step completed."""

    def __init__(self, step: int):
        if step < 1:
            raise ValueError(f"a layer replay observes a training step (1 or later), got {step}")
        self.step = step
        self.calls: dict[int, LayerCall] = {}
        self.unobserved: dict[str, str] = {}   # variable-free layer name -> why not compared
        self.values: dict[int, dict[str, np.ndarray]] | None = None   # replica -> name -> value
        self.units: dict[int, Any] = {}   # call index -> the layer object called
        self.stop_after_step = False
        self._lock = threading.Lock()

    def describe(self, index: int, call: LayerCall, unit: Any = None) -> None:
        """What call `index` is; the first trace that numbers it says (the training step's
        function is traced before an evaluation's). `unit`: the layer object called."""
        with self._lock:
            self.calls.setdefault(index, call)
            if unit is not None:
                self.units.setdefault(index, unit)

    def not_compared(self, layer: str, why: str) -> None:
        with self._lock:
            self.unobserved.setdefault(layer, why)

    def observed_as_input(self, layer: str) -> None:
        with self._lock:
            self.unobserved.pop(layer, None)

    def take(self, step: int, by_replica: dict[int, dict[str, Any]]) -> None:
        """The values sent during optimizer step `step`, by replica (kept if it is the step
        asked for)."""
        if step != self.step:
            return
        with self._lock:
            self.values = {replica: {name: np.asarray(v) for name, v in values.items()}
                           for replica, values in by_replica.items()}

    def capture(self, names: NameMap) -> LayerCapture:
        """The step's values in canonical terms (see the module's docstring). Raises when the
        step was never completed (the run stopped before it)."""
        if self.values is None:
            raise RuntimeError(f"the layer replay saw no step {self.step}: the run ended before "
                               f"it, or its layers are not Keras layers the taps observe")
        grouped: dict[tuple[str, str, str], list] = {}
        first_seen: dict[tuple[str, str, str], tuple[int, LayerCall]] = {}
        for index in sorted(self.calls):
            call = self.calls[index]
            layer, permutation = _canonical_layer(call, names)
            for kind in KINDS:
                by_part: dict[str, list] = {}
                for replica in sorted(self.values):
                    for part, forward, backward in _sent(self.values[replica],
                                                         f"{index}:{kind}", call.parts):
                        if kind == "input" and permutation is not None:
                            forward = _permute_last_axis(permutation, forward)
                            backward = None if backward is None else \
                                _permute_last_axis(permutation, backward)
                        by_part.setdefault(part, []).append((forward, backward))
                for part, sent in by_part.items():
                    key = (layer, kind, part)
                    grouped.setdefault(key, []).append(sent)
                    first_seen.setdefault(key, (index, call))
        units = {}
        for index in sorted(self.units):
            units.setdefault(_canonical_layer(self.calls[index], names)[0], self.units[index])
        entries = []
        for key, calls in sorted(grouped.items(), key=lambda item: (first_seen[item[0]][0],
                                                                     item[0][2])):
            index, call = first_seen[key]
            sent = [s for replicas in calls for s in replicas]
            forward = _join([f for f, _ in sent])
            grads = [g for _, g in sent]
            backward = None if any(g is None for g in grads) else _join(grads)
            entries.append(ObservedLayer(key[0], key[1], len(entries), call.layer_class,
                                         call.fed_by if key[1] == "input" else "",
                                         forward, backward, part=key[2]))
        unobserved = tuple(f"{layer} ({why})" for layer, why in sorted(self.unobserved.items()))
        return LayerCapture(self.step, tuple(entries), unobserved, replicas=len(self.values),
                            units=units)


def layer_name(canonical_variables: list[str]) -> str:
    """A layer's canonical name: the common path of the canonical variables it holds.

    >>> layer_name(["dense/kernel", "dense/bias"]), layer_name(["embedding/items"])
    ('dense', 'embedding/items')
    >>> layer_name(["embedding/user", "embedding/item"]), layer_name(["a/k", "b/k"])
    ('embedding', 'a/k, b/k')
    """
    if len(canonical_variables) == 1:
        return canonical_variables[0]
    parts = [name.split("/") for name in canonical_variables]
    common = []
    for pieces in zip(*parts):
        if len(set(pieces)) != 1:
            break
        common.append(pieces[0])
    return "/".join(common) if common else ", ".join(sorted(canonical_variables))


def input_permutation(variables: tuple[str, ...], names: NameMap) -> PermuteRows | None:
    """The row permutation the name map applies to one of a layer's variables (its kernel),
    which a layer input meets along its last axis; None when there is none."""
    for native in variables:
        found = names.canonical_of(native)
        if found is not None and isinstance(found[1], PermuteRows):
            return found[1]
    return None


def _canonical_layer(call: LayerCall, names: NameMap) -> tuple[str, PermuteRows | None]:
    """The call's canonical layer name, and the row permutation of its kernel, if the name map
    permutes one (its input's last axis is permuted the same way)."""
    if call.loss:
        return "loss", None
    canonical, permutation = [], None
    for native in call.variables:
        found = names.canonical_of(native)
        if found is None:
            continue
        canonical.append(found[0])
        if isinstance(found[1], PermuteRows):
            permutation = found[1]
    if not canonical:   # no variable the map knows: named by the layer itself
        return f"{call.layer_class} {call.layer_name} (unmapped)", None
    return layer_name(canonical), permutation


def _sent(values: dict[str, np.ndarray], name: str, parts: tuple[str, ...]) -> list[tuple]:
    """What was sent as `name`, as (part, value, gradient or None) triples: one, unnamed, or
    one per tensor of an output sent as `name#<path>` (several tensors, or a feature-column
    layer's features: its one output gradient split along the last axis by their widths)."""
    named = sorted(k[len(name) + 1:] for k in values
                   if k.startswith(name + "#") and not k.endswith(GRAD))
    if len(named) > 1:
        whole = values.get(name + GRAD)
        split = {}
        if parts and whole is not None and set(parts) == set(named):
            edges = np.cumsum([np.shape(values[f"{name}#{p}"])[-1] for p in parts])[:-1]
            split = dict(zip(parts, np.split(np.asarray(whole), edges, axis=-1)))
        return [(part, values[f"{name}#{part}"],
                 values.get(f"{name}#{part}{GRAD}", split.get(part))) for part in named]
    if name in values:
        return [("", values[name], values.get(name + GRAD))]
    return []


def _permute_last_axis(permutation: PermuteRows, value: np.ndarray) -> np.ndarray:
    moved = np.moveaxis(np.asarray(value), -1, 0)
    return np.moveaxis(permutation.to_canonical(moved), 0, -1)


def _join(parts: list[np.ndarray]) -> np.ndarray:
    """Several calls' or replicas' values, joined along the batch axis (scalars: summed)."""
    if len(parts) == 1:
        return parts[0]
    if all(np.ndim(p) == 0 for p in parts):
        return np.asarray(sum(np.float64(p) for p in parts), dtype=np.asarray(parts[0]).dtype)
    return np.concatenate(parts, axis=0)
