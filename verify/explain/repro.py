"""A standalone repro of a layer found local: a short script and the values it needs.

`write_layer_repro` writes, into `<report>/repro/<case>/<reference>--<candidate>/`:

- `values.npz`: exactly what the substitution gave each side's layer: `<side>/input` (in that
  side's own layout) and `<side>/weight<i>` (in the order of the rebuilt layer's `weights`);
- `repro.py`: imports TensorFlow and NumPy, nothing of the suite; rebuilds each side's layer
  from its class and `get_config()` (written into the script), gives it its values, runs both,
  prints the largest difference and exits 1 when it exceeds `TOLERANCE` (the substitution's
  bound: a multiple of the reference layer's one-ulp floor), 0 otherwise;
- `repro.json`: what `python -m verify repro` needs to run it (the environment) and the
  figures the suite measured.

`write_lookup_repro` does the same for an embedding lookup found local: `values.npz` holds the
reference's `table` before the step, the step's `ids` and each example's count of them
(`row_lengths`); the script looks them up with `tf.nn.safe_embedding_lookup_sparse` under each
side's declared combiner. `write_update_repro`, for an optimizer update.

Writing it imports no TensorFlow; only the script does, where the user runs it.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from verify.explain.substitution import FLOOR_MULTIPLE, Substitution, times_bound

SCRIPT = "repro.py"
VALUES = "values.npz"
RECORD = "repro.json"

TEMPLATE = '''"""{title}

Both sides' `{layer}` layers ({classes}) rebuilt from their configs and given the same input
and weights ({values}, the reference's at step {step}). The largest difference between their
outputs is printed; the script exits 1 when it exceeds TOLERANCE ({multiple:g} x the reference
layer's own one-ulp floor, {floor:.3g}, as the parity suite measured it), else 0.
Needs TensorFlow and NumPy only.
"""
import importlib
import json
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

TOLERANCE = {tolerance!r}
SIDES = {{   # side: (its label, the layer's class, its get_config(), how many weights)
{sides}
}}


def layer_class(path):
    """`tf.keras.layers.Dense`, or `module:Class` for a layer of one's own."""
    if ":" in path:
        module, name = path.split(":")
        return getattr(importlib.import_module(module), name)
    found = tf
    for part in path.split(".")[1:]:
        found = getattr(found, part)
    return found


def run(side, values):
    _, path, config, count = SIDES[side]
    layer = layer_class(path).from_config(json.loads(config))
    x = tf.constant(values[side + "/input"])
    layer(x)   # creates its variables
    layer.set_weights([values[f"{{side}}/weight{{i}}"] for i in range(count)])
    return np.asarray(layer(x), np.float64)


def main():
    values = np.load(Path(__file__).resolve().with_name("{values}"))
    with tf.device("/cpu:0"):
        reference, candidate = run("reference", values), run("candidate", values)
    difference = float(np.abs(candidate.reshape(reference.shape) - reference).max())
    differs = not difference <= TOLERANCE
    print(f"{{SIDES['reference'][0]}} vs {{SIDES['candidate'][0]}}: `{layer}` outputs differ by "
          f"{{difference:.3g}} (tolerance {{TOLERANCE:.3g}}): "
          + ("the layer computes differently" if differs else "the layer computes alike"))
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
'''


UPDATE_TEMPLATE = '''"""{title}

Each side's optimizer ({classes}), built from its class and declared hyperparameters, applied
once to the same weights and gradient ({values}: the reference's weights before step {step} and
its gradient at step {step}). Per variable the largest difference between the updated weights
is printed; the script exits 1 when one exceeds its TOLERANCES entry ({multiple:g} x the
reference optimizer's own one-ulp floor for that variable, as the parity suite measured it),
else 0. Needs TensorFlow and NumPy only.
"""
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

TOLERANCES = {tolerances}
SIDES = {{   # side: (its label, the optimizer's class, its hyperparameters)
{sides}
}}


def update(side, values):
    _, path, arguments = SIDES[side]
    found = tf
    for part in path.split(".")[1:]:
        found = getattr(found, part)
    optimizer = found(**arguments)
    variables = {{name: tf.Variable(values["weight/" + name]) for name in TOLERANCES}}
    optimizer.apply_gradients([(tf.constant(values["grad/" + name]), variables[name])
                               for name in TOLERANCES])
    return {{name: np.asarray(v.numpy(), np.float64) for name, v in variables.items()}}


def main():
    values = np.load(Path(__file__).resolve().with_name("{values}"))
    with tf.device("/cpu:0"):
        reference, candidate = update("reference", values), update("candidate", values)
    differs = False
    for name, tolerance in TOLERANCES.items():
        difference = float(np.abs(candidate[name] - reference[name]).max())
        differs = differs or not difference <= tolerance
        print(f"{{name}}: updated weights differ by {{difference:.3g}} (tolerance "
              f"{{tolerance:.3g}})")
    print(f"{{SIDES['reference'][0]}} vs {{SIDES['candidate'][0]}}: "
          + ("the update rule differs" if differs else "the update rule computes alike"))
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
'''


LOOKUP_TEMPLATE = '''"""{title}

The embedding lookup `{table}` under each side's declared combiner, on the same ids and table
({values}: the reference's table before step {step}, the ids of step {step}, each id weighing
1), with TensorFlow's own op (`tf.nn.safe_embedding_lookup_sparse`, which a TF1
`embedding_column` and a tfrs `TPUEmbedding` on the CPU run). The largest difference between the
two outputs is printed; the script exits 1 when it exceeds TOLERANCE ({multiple:g} x the
reference lookup's own one-ulp floor, {floor:.3g}, as the parity suite measured it), else 0.
Needs TensorFlow and NumPy only.
"""
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

TOLERANCE = {tolerance!r}
SIDES = {{   # side: (its label, its declared combiner)
{sides}
}}


def lookup(combiner, values):
    lengths = values["row_lengths"].astype(np.int64)
    rows = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    positions = np.arange(len(rows), dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths,
                                                                  lengths)
    ids = tf.SparseTensor(np.stack([rows, positions], axis=1).reshape(-1, 2),
                          values["ids"].astype(np.int64),
                          [len(lengths), max(int(lengths.max(initial=0)), 1)])
    found = tf.nn.safe_embedding_lookup_sparse(tf.constant(values["table"]), ids, None,
                                               combiner=combiner)
    return np.asarray(found, np.float64)


def main():
    values = np.load(Path(__file__).resolve().with_name("{values}"))
    with tf.device("/cpu:0"):
        reference = lookup(SIDES["reference"][1], values)
        candidate = lookup(SIDES["candidate"][1], values)
    difference = float(np.abs(candidate - reference).max(initial=0.0))
    differs = not difference <= TOLERANCE
    print(f"{{SIDES['reference'][0]}} vs {{SIDES['candidate'][0]}}: `{table}` lookups, combiner "
          f"{{SIDES['reference'][1]!r}} vs {{SIDES['candidate'][1]!r}}, differ by "
          f"{{difference:.3g}} (tolerance {{TOLERANCE:.3g}}): "
          + ("the lookup computes differently" if differs else "the lookup computes alike"))
    return 1 if differs else 0


if __name__ == "__main__":
    sys.exit(main())
'''


def repro_directory(report_dir: Path, case: str, reference: str, candidate: str) -> Path:
    """Where a pair's repro goes: `<report>/repro/<case>/<reference>--<candidate>`."""
    return Path(report_dir) / "repro" / case / f"{reference}--{candidate}"


def write_layer_repro(directory: Path, substitution: Substitution, reference, candidate, *,
                      step: int, sides: tuple[str, str], environment: str,
                      title: str = "") -> Path:
    """Write the repro of `substitution`'s layer into `directory` (see the module's
    docstring); `reference` and `candidate` are the two runs the substitution judged (each
    with `inputs`, `weights`, `path` and `config`). Returns the script's path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {}
    for side, run in (("reference", reference), ("candidate", candidate)):
        arrays[f"{side}/input"] = np.asarray(run.inputs)
        arrays.update({f"{side}/weight{i}": np.asarray(w) for i, w in enumerate(run.weights)})
    np.savez(directory / VALUES, **arrays)
    lines = [f"    {side!r}: ({label!r}, {run.path!r},\n        {run.config!r}, "
             f"{len(run.weights)}),"
             for side, label, run in (("reference", sides[0], reference),
                                      ("candidate", sides[1], candidate))]
    classes = substitution.layer_class
    script = TEMPLATE.format(
        title=title or f"Repro: layer `{substitution.layer}` of {sides[0]} and {sides[1]}",
        layer=substitution.layer, classes=classes, values=VALUES, step=step,
        multiple=FLOOR_MULTIPLE, floor=substitution.floor, tolerance=float(substitution.bound),
        sides="\n".join(lines))
    (directory / SCRIPT).write_text(script)
    (directory / RECORD).write_text(json.dumps({
        "environment": environment, "reference": sides[0], "candidate": sides[1],
        "unit": f"layer `{substitution.layer}` ({classes})", "step": step,
        "verdict": substitution.verdict, "difference": substitution.drift,
        "tolerance": substitution.bound, "floor": substitution.floor}, indent=1) + "\n")
    return directory / SCRIPT


def write_update_repro(directory: Path, judged: list[Substitution], sides, weights: dict,
                       gradients: dict, *, step: int, names: tuple[str, str],
                       environment: str = "local") -> Path:
    """Write the repro of an optimizer update found local into `directory`: `sides` holds each
    side's (class path, constructor arguments), `judged` one `Substitution` per variable (its
    bound is the variable's tolerance). Returns the script's path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {f"weight/{name}": np.asarray(value) for name, value in weights.items()}
    arrays.update({f"grad/{name}": np.asarray(value) for name, value in gradients.items()})
    np.savez(directory / VALUES, **arrays)
    lines = [f"    {side!r}: ({label!r}, {path!r}, {arguments!r}),"
             for side, label, (path, arguments) in zip(("reference", "candidate"), names, sides)]
    classes = " | ".join(dict.fromkeys(path for path, _ in sides))
    tolerances = "{\n" + "".join(f"    {s.layer!r}: {float(s.bound)!r},\n" for s in judged) + "}"
    script = UPDATE_TEMPLATE.format(
        title=f"Repro: the optimizer update of {names[0]} and {names[1]}", classes=classes,
        values=VALUES, step=step, multiple=FLOOR_MULTIPLE, tolerances=tolerances,
        sides="\n".join(lines))
    (directory / SCRIPT).write_text(script)
    worst = max(judged, key=times_bound)   # the verdict the pair's sentence gives
    (directory / RECORD).write_text(json.dumps({
        "environment": environment, "reference": names[0], "candidate": names[1],
        "unit": f"the optimizer update ({classes})", "step": step,
        "verdict": worst.verdict, "difference": worst.drift, "tolerance": worst.bound,
        "floor": worst.floor}, indent=1) + "\n")
    return directory / SCRIPT


def write_lookup_repro(directory: Path, substitution, table: np.ndarray, ids: np.ndarray,
                       row_lengths: np.ndarray, *, step: int, sides: tuple[str, str],
                       environment: str) -> Path:
    """Write the repro of an embedding lookup's substitution (a `LookupSubstitution`, with its
    table, its ids and their counts per example) into `directory` (see the module's
    docstring). Returns the script's path."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    np.savez(directory / VALUES, table=np.asarray(table), ids=np.asarray(ids, np.int64),
             row_lengths=np.asarray(row_lengths, np.int64))
    lines = [f"    {side!r}: ({label!r}, {combiner!r}),"
             for side, label, combiner in zip(("reference", "candidate"), sides,
                                              substitution.combiners)]
    script = LOOKUP_TEMPLATE.format(
        title=f"Repro: the embedding lookup `{substitution.table}` of {sides[0]} and {sides[1]}",
        table=substitution.table, values=VALUES, step=step, multiple=FLOOR_MULTIPLE,
        floor=substitution.floor, tolerance=float(substitution.bound), sides="\n".join(lines))
    (directory / SCRIPT).write_text(script)
    unit = (f"the embedding lookup `{substitution.table}` (combiner "
            f"{substitution.combiners[0]!r} vs {substitution.combiners[1]!r})")
    (directory / RECORD).write_text(json.dumps({
        "environment": environment, "reference": sides[0], "candidate": sides[1],
        "unit": unit, "step": step, "verdict": substitution.verdict,
        "difference": substitution.drift, "tolerance": substitution.bound,
        "floor": substitution.floor}, indent=1) + "\n")
    return directory / SCRIPT
