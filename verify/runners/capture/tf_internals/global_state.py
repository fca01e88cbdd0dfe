"""Process-wide state a user's code may change (`verify.runners.capture.process_state`). Each
pair reads and sets one switch that TensorFlow or legacy Keras keep without a public getter:
the global seed and op-seed generator, the global `tf.random.Generator`, op determinism, the
grappler options, eager execution by default and legacy Keras' global mixed-precision
policy."""
from __future__ import annotations

import sys
from typing import Any


def global_seed() -> tuple[Any, Any]:
    """The eager global seed and the position of the generator of op seeds derived from it
    (`context.context()._seed`, `._rng`): `tf.random.set_seed` resets both."""
    from tensorflow.python.eager import context

    ctx = context.context()
    rng = getattr(ctx, "_rng", None)
    return ctx._seed, (rng.getstate() if rng is not None else None)


def set_global_seed(value: tuple[Any, Any]) -> None:
    import tensorflow as tf
    from tensorflow.python.eager import context

    seed, position = value
    tf.random.set_seed(seed)   # also clears the kernel cache of seeded random ops
    ctx = context.context()
    if position is None:
        ctx._rng = None        # as a fresh context has it
    elif getattr(ctx, "_rng", None) is not None:
        ctx._rng.setstate(position)


def global_generator() -> Any:
    """The global `tf.random.Generator` (`stateful_random_ops.global_generator`; None until
    `tf.random.get_global_generator()` first creates it)."""
    from tensorflow.python.ops import stateful_random_ops

    return stateful_random_ops.global_generator


def set_global_generator(generator: Any) -> None:
    from tensorflow.python.ops import stateful_random_ops

    stateful_random_ops.global_generator = generator   # the public setter refuses None


def op_determinism() -> bool:
    """`tf.config.experimental.enable_op_determinism()`'s switch (`config` has no public
    `disable_op_determinism` export)."""
    from tensorflow.python.framework import config

    return bool(config.is_op_determinism_enabled())


def set_op_determinism(enabled: bool) -> None:
    from tensorflow.python.framework import config

    (config.enable_op_determinism if enabled else config.disable_op_determinism)()


def grappler_options() -> dict[str, Any]:
    """The grappler options set by `tf.config.optimizer.set_experimental_options`
    (`context.context()._optimizer_experimental_options`; the public getter adds defaults, so
    an option once set could not be unset through it)."""
    from tensorflow.python.eager import context

    return dict(context.context()._optimizer_experimental_options)


def set_grappler_options(options: dict[str, Any]) -> None:
    from tensorflow.python.eager import context

    ctx = context.context()
    ctx._optimizer_experimental_options = dict(options)
    ctx._thread_local_data.function_call_options = None   # rebuilt from the options


def eager_by_default() -> bool:
    """Whether TensorFlow executes eagerly by default (`context.default_execution_mode`), which
    `tf.compat.v1.disable_eager_execution()` switches off for the whole process."""
    from tensorflow.python.eager import context

    return context.default_execution_mode == context.EAGER_MODE


def set_eager_by_default(eager: bool) -> None:
    from tensorflow.python.eager import context

    context.default_execution_mode = context.EAGER_MODE if eager else context.GRAPH_MODE
    ctx = context.context_safe()
    if ctx is not None:
        ctx._thread_local_data.is_eager = eager


def keras_global_policy(keras) -> Any:
    """Legacy Keras' global mixed-precision policy as set (None: follow floatx), which
    `clear_session()` keeps (`keras.src.mixed_precision.policy._global_policy`, or
    `tf_keras.src...` in the TF 2.21 environment)."""
    module = sys.modules.get(f"{keras.__name__.split('.')[0]}.src.mixed_precision.policy")
    if module is None:   # never imported: nobody set a policy
        return None
    return module._global_policy
