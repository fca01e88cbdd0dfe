"""Read a pipeline's static configuration from its TensorFlow objects, as plain values.

Used by the runners' `declared_config`; the values are diffed by `verify.judge.preflight`. Keys:

- `table/<canonical>/{vocabulary_size,dim,combiner,initializer,features}`
- `optimizer/model/*`: the optimizer of the model_fn (TF1) or of `compile` (TF2);
  `optimizer/embedding/*`: `EmbeddingConfigSpec.optimization_parameters` (TF1) or the
  `TPUEmbedding` layer's optimizer (TF2). Hyperparameters under one name whatever the API calls
  them (`_lr`, `learning_rate` -> `learning_rate`; `_beta1` -> `beta_1`; ...); `epsilon` is
  `NO_EPSILON` for optimizers without an epsilon term (TF1 Adagrad/FTRL, the TPU engine's);
  an embedding optimizer also has the engine's own parameters (weight and gradient clipping,
  weight decay, FTRL's linear-slot options: `describe_engine_parameters`).
- `data/{global_batch_size,shuffle,drop_remainder}`, `loss/reduction`, and
  `loop/steps_per_call` (`iterations_per_loop=N` or `steps_per_execution=N`).
"""
from __future__ import annotations

from typing import Any

from verify.runners.capture.tf_internals import optimizer_attributes, wrapped_optimizer

KINDS = {
    "gradientdescentoptimizer": "sgd", "sgd": "sgd", "stochasticgradientdescentparameters": "sgd",
    "adagradoptimizer": "adagrad", "adagrad": "adagrad", "adagradparameters": "adagrad",
    "adamoptimizer": "adam", "adam": "adam", "adamparameters": "adam",
    "ftrloptimizer": "ftrl", "ftrl": "ftrl", "ftrlparameters": "ftrl",
}
NO_EPSILON = "none (no epsilon term)"
# Optimizers whose update has no epsilon term at all.
WITHOUT_EPSILON = {"adagradoptimizer", "adagradparameters", "ftrloptimizer", "ftrlparameters",
                   "ftrl", "gradientdescentoptimizer", "stochasticgradientdescentparameters"}
SYNONYMS = {
    "learning_rate": ("_learning_rate", "_lr", "learning_rate"),
    "initial_accumulator_value": ("_initial_accumulator_value", "initial_accumulator",
                                  "initial_accumulator_value"),
    "epsilon": ("_epsilon", "epsilon"),
    "beta_1": ("_beta1", "beta_1", "beta1"),
    "beta_2": ("_beta2", "beta_2", "beta2"),
    "l1_regularization_strength": ("_l1_regularization_strength", "l1_regularization_strength"),
    "l2_regularization_strength": ("_l2_regularization_strength", "l2_regularization_strength"),
    "l2_shrinkage_regularization_strength": ("_l2_shrinkage_regularization_strength",
                                             "l2_shrinkage_regularization_strength"),
    "learning_rate_power": ("_learning_rate_power", "learning_rate_power"),
    "beta": ("_beta", "beta"),
    "momentum": ("_momentum", "momentum"),
    "lazy_adam": ("lazy_adam",),
    "sum_inside_sqrt": ("sum_inside_sqrt",),
    "use_gradient_accumulation": ("use_gradient_accumulation",),
}


def _plain(value: Any) -> Any:
    if hasattr(value, "numpy"):
        value = value.numpy()
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float):
        return float(f"{value:.7g}")
    return value


def describe_optimizer(optimizer: Any, prefix: str) -> dict[str, Any]:
    """Kind and hyperparameters of any TF1, Keras or TPU-embedding optimizer object (a subclass
    of a known optimizer is described as the optimizer it extends)."""
    class_name = next((c.__name__ for c in type(optimizer).__mro__ if c.__name__.lower() in KINDS),
                      type(optimizer).__name__)
    values = optimizer_attributes(optimizer)
    inner = wrapped_optimizer(optimizer)   # CrossShardOptimizer, LossScaleOptimizer wrap one
    if inner is not None and type(inner).__name__.lower() in KINDS:
        described = describe_optimizer(inner, prefix)
        scale = loss_scale(optimizer)
        if scale is not None:
            described[f"{prefix}/loss_scale"] = scale
        return described
    out = {f"{prefix}/kind": KINDS.get(class_name.lower(), class_name.lower())}
    for name, aliases in SYNONYMS.items():
        for alias in aliases:
            value = values.get(alias)
            if isinstance(value, (int, float, bool)) or hasattr(value, "numpy"):
                out[f"{prefix}/{name}"] = _plain(value)
                break
    for name, aliases in GRADIENT_TRANSFORMS.items():
        value = next((values[a] for a in aliases if values.get(a) is not None), None)
        out[f"{prefix}/{name}"] = _plain(value) if value else "none"
    if out[f"{prefix}/use_ema"] == "none":
        out[f"{prefix}/ema_momentum"] = "none"   # unused without EMA
    out[f"{prefix}/loss_scale"] = loss_scale(optimizer) or "none"
    # tf.tpu.experimental.embedding.* (TF2) and tf.compat.v1.tpu.experimental.*Parameters (TF1)
    tpu_engine = "tpu" in type(optimizer).__module__
    if class_name.lower() in WITHOUT_EPSILON or (tpu_engine and out[f"{prefix}/kind"] != "adam"):
        out[f"{prefix}/epsilon"] = NO_EPSILON
    if tpu_engine:
        out.update(describe_engine_parameters(values, out[f"{prefix}/kind"], prefix))
    return out


# What the TPU embedding engine does besides an optimizer's update rule, under the same names
# in TF1's `*Parameters` and TF2's `tf.tpu.experimental.embedding` optimizers (TF2's
# `clipvalue` is stored as clip_gradient_min/max). Unset flags mean False in both APIs; TF2's
# FTRL has no initial_linear_value: its linear slot starts at 0 (`FTRL._slot_initializers`).
ENGINE_PARAMETERS = ("clip_weight_min", "clip_weight_max", "clip_gradient_min",
                     "clip_gradient_max", "weight_decay_factor",
                     "multiply_weight_decay_factor_by_learning_rate")
FTRL_ENGINE_PARAMETERS = ("initial_linear_value", "multiply_linear_by_learning_rate",
                          "allow_zero_accumulator")
ENGINE_DEFAULTS = {"multiply_weight_decay_factor_by_learning_rate": False,
                   "multiply_linear_by_learning_rate": False, "allow_zero_accumulator": False,
                   "initial_linear_value": 0.0}


def describe_engine_parameters(values: dict[str, Any], kind: str, prefix: str) -> dict[str, Any]:
    """The TPU embedding engine's own parameters of an embedding optimizer ("none" when unset).

    >>> describe_engine_parameters({"clip_weight_max": 1.0}, "adagrad", "e")["e/clip_weight_max"]
    1.0
    >>> describe_engine_parameters({}, "ftrl", "e")["e/initial_linear_value"]
    0.0
    """
    out = {}
    for name in ENGINE_PARAMETERS + (FTRL_ENGINE_PARAMETERS if kind == "ftrl" else ()):
        value = values.get(name)
        if value is None:
            value = ENGINE_DEFAULTS.get(name, "none")
        out[f"{prefix}/{name}"] = value if isinstance(value, str) else _plain(value)
    return out


# What an optimizer does to the gradients or the weights besides its update rule: each is
# recorded for every optimizer ("none" when it does not), so Adam(clipnorm=1.0) and Adam()
# describe differently and preflight flags the difference as blocking.
GRADIENT_TRANSFORMS = {
    "clipnorm": ("clipnorm", "_clipnorm"),
    "global_clipnorm": ("global_clipnorm", "_global_clipnorm"),
    "clipvalue": ("clipvalue", "_clipvalue"),
    "weight_decay": ("weight_decay",),
    "use_ema": ("use_ema",),
    "ema_momentum": ("ema_momentum",),
    # Keras 3: the mean gradient of N steps applied every N-th step
    "gradient_accumulation_steps": ("gradient_accumulation_steps",),
}


def loss_scale(optimizer: Any) -> str | None:
    """'dynamic' or the fixed loss scale of a Keras `LossScaleOptimizer`, else None."""
    if "lossscale" not in type(optimizer).__name__.lower():
        return None
    if getattr(optimizer, "dynamic", False):
        return "dynamic"
    return str(_plain(getattr(optimizer, "loss_scale", "fixed")))


def describe_initializer(initializer: Any) -> str:
    """`TruncatedNormal(mean=0, stddev=0.447214)`-style text, the same for TF1 and TF2 objects."""
    if initializer is None:
        return "default"
    name = type(initializer).__name__.replace("Initializer", "").replace("V2", "")
    config = {}
    if hasattr(initializer, "get_config"):
        config = initializer.get_config()
    else:
        config = {k: v for k, v in vars(initializer).items() if not k.startswith("_")}
    parts = [f"{k}={_plain(v):g}" if isinstance(_plain(v), float) else f"{k}={_plain(v)}"
             for k, v in sorted(config.items()) if k not in ("dtype",) and v is not None]
    return f"{name}({', '.join(parts)})"


def describe_dataset(serialized_graph: bytes, replicas: int = 1) -> dict[str, Any]:
    """Shuffle (none / seeded(...) / unseeded), batch size and drop_remainder of a tf.data
    pipeline, read from its serialized graph (`verify.runners.capture.tf_internals.serialized_dataset_graph`)."""
    import tensorflow as tf
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(serialized_graph)
    consts = {n.name: n for n in graph.node if n.op == "Const"}

    def const_inputs(node):
        values = []
        for name in node.input:
            c = consts.get(name.split(":")[0])
            if c is not None and c.attr["value"].tensor.dtype not in (
                    tf.variant.as_datatype_enum, tf.resource.as_datatype_enum):
                values.append(tf.make_ndarray(c.attr["value"].tensor).tolist())
        return values

    out: dict[str, Any] = {"data/shuffle": "none"}
    for node in graph.node:
        if node.op.startswith("Shuffle"):
            values = const_inputs(node)
            seeds = values[1:3] if len(values) >= 3 else []
            out["data/shuffle"] = ("unseeded" if not seeds or seeds == [0, 0]
                                   else f"seeded({seeds[1]})")
        elif node.op.startswith("BatchDataset"):
            values = const_inputs(node)
            if values:
                out["data/global_batch_size"] = int(values[0]) * replicas
            if len(values) > 1:
                out["data/drop_remainder"] = bool(values[1])
    return out
