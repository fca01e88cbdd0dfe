"""The private parts of a user's pipeline the suite reads without running its steps: a
`tf.data.Dataset`'s serialized graph, the loss given to Keras' `compile`, and the TF2
checkpoint writes it makes."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator


def serialized_dataset_graph(dataset) -> Any:
    """The serialized GraphDef of a `tf.data.Dataset` (`Dataset._as_serialized_graph`): a
    tensor in TF1 graph mode (run it in a session), an eager tensor in TF2 (`.numpy()`)."""
    return dataset._as_serialized_graph()


def compiled_user_loss(model) -> Any:
    """The loss given to `compile` (`model.compiled_loss._user_losses`, Keras 2.15): a string,
    a loss object or None."""
    return getattr(model.compiled_loss, "_user_losses", None)


@contextlib.contextmanager
def checkpoint_writes(callback) -> Iterator[None]:
    """Call `callback(file_prefix)` before every TF2 checkpoint write in the block:
    `tf.train.Checkpoint.save`, `.write` and `tf.train.CheckpointManager.save` all write through
    `Checkpoint._write(file_prefix, ...)` (TF 2.15; `save` passes the numbered prefix,
    `ckpt-1`). The write itself is the original, called with the same arguments."""
    from tensorflow.python.checkpoint import checkpoint as checkpoint_lib

    original = checkpoint_lib.Checkpoint._write

    def write(self, file_prefix, *args, **kwargs):
        callback(file_prefix)
        return original(self, file_prefix, *args, **kwargs)

    checkpoint_lib.Checkpoint._write = write
    try:
        yield
    finally:
        checkpoint_lib.Checkpoint._write = original
