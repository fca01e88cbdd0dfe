"""The recommender's Keras 3 + keras-rs implementations, declared without importing Keras (the
case module imports in every environment; `keras_rs.py` runs only in a keras3 one).

- `keras3-jax`, `keras3-tf` (SGD, Adagrad, Adam): `cases.recommender.keras_rs` on each
  backend, compared with tf1 and with the oracle;
- recommender_adagrad `control-keras3-tf-repeated-rows`: the plain Keras 3 Adagrad on the
  TensorFlow backend, which squares the pieces of a repeated row apart (see `keras_rs.py`);
- recommender_adam `control-keras3-adam-epsilon`: `keras.optimizers.Adam`'s default epsilon
  1e-7 where TF1's `AdamOptimizer` uses 1e-8 (a Keras 3 default that differs from TF1's);
- recommender_ftrl `control-keras3-ftrl-dense-update`: the rewrite with Keras 3's `Ftrl`. No
  Keras 3 FTRL trains a table as TF1's does off a TPU: TF1 updates the rows a batch looked up;
  Keras 3's `Ftrl` recomputes every row from its `linear` slot (the JAX backend's gradients
  are dense, the TensorFlow one densifies them), which sets each row no batch has looked up
  yet to 0. So FTRL has no faithful Keras 3 pair here, only this control.
"""
from verify import Expectation, Implementation, Mapped, NameMap, lazy_runner

KERAS_RS = "cases.recommender.keras_rs:runner"
# Keras 3's slot names -> the canonical (legacy Keras) ones
SLOT_NAMES = {"momentum": "m", "velocity": "v"}
# The id format keras-rs documents for each backend (see cases.tpu_embedding.keras_rs).
BACKENDS = (("jax", "JAX", "dense"), ("tf", "TensorFlow", "sparse"))


def keras_rs_names(tf2_names: NameMap, tables) -> NameMap:
    """The tfrs rewrite's name map with keras-rs' table variables: `<layer>/<table>/embeddings`."""
    entries = dict(tf2_names.entries)
    for table in tables:
        entries[f"embedding/{table.name}"] = Mapped(
            f"distributed_embedding/{table.name}/embeddings")
    return NameMap(entries)


def keras_rs_implementations(optimizer: str, batch_size: int, names: NameMap
                             ) -> tuple[list[Implementation], list[tuple[str, str]]]:
    """The implementations and their pairs (each against tf1 and the oracle)."""
    def keras_rs(**arguments):
        return lazy_runner(KERAS_RS, optimizer=optimizer, batch_size=batch_size, **arguments)

    def control(name, environment, runner, description, expect):
        return Implementation(name, runner, names, environment=environment,
                              slot_names=SLOT_NAMES, description=description, expect=expect)

    implementations = []
    if optimizer != "ftrl":
        implementations += [
            Implementation(f"keras3-{short}", keras_rs(ids=ids), names,
                           environment=f"keras3-{short}", slot_names=SLOT_NAMES,
                           description=f"keras-rs DistributedEmbedding + Keras 3 fit, {backend} "
                                       f"backend, {ids} ids")
            for short, backend, ids in BACKENDS]
    if optimizer == "adagrad":
        implementations.append(control(
            "control-keras3-tf-repeated-rows", "keras3-tf",
            keras_rs(ids="sparse", sum_repeated_rows=False),
            "the plain keras.optimizers.Adagrad on the TensorFlow backend: an item in both the "
            "history and the candidate is two gradient pieces of one row, squared apart",
            Expectation(step=1, quantity="slot", tensor="embedding/item/accumulator",
                        cause="repeated_rows", why="the gradient of step 1 (its pieces summed) is right; the item "
                            "accumulator adds g1^2 + g2^2 instead of (g1 + g2)^2")))
    if optimizer == "adam":
        implementations.append(control(
            "control-keras3-adam-epsilon", "keras3-jax", keras_rs(ids="dense", epsilon="default"),
            "keras.optimizers.Adam's default epsilon 1e-7, TF1 AdamOptimizer 1e-8",
            Expectation(step=1, quantity="weight", cause="epsilon x10",
                        why="m and v of step 1 do not depend on "
                        "epsilon; the update lr*m/(sqrt(v)+eps) does, visibly where |g| is "
                        "1e-6 to 1e-5")))
    if optimizer == "ftrl":
        implementations.append(control(
            "control-keras3-ftrl-dense-update", "keras3-jax", keras_rs(ids="dense"),
            "the rewrite with keras.optimizers.Ftrl: it recomputes every table row from its "
            "linear slot, so the rows step 1 did not look up become 0; TF1 leaves them",
            Expectation(step=1, quantity="weight", cause="untouched_rows_updated",
                        why="loss, gradients and slots of step 1 "
                        "agree; the table rows no example of the batch looked up do not")))
    pairs = [(reference, i.name) for i in implementations for reference in ("tf1", "oracle")]
    return implementations, pairs
