"""What a capture's overhead is measured against, and in what order the runs go.

- `bare_keras_fit`: the Keras runner's uninstrumented run as a user's plain `model.fit` is,
  reading nothing between steps. (The runner's own uninstrumented run reads every variable
  and slot at each execution boundary: at `steps_per_execution=1` every step, no baseline for
  an overhead.)
- `rotated`: the order of one round of runs, turned by one place each round, so that no kind
  of run always follows the same other (a run pays for what the one before left behind:
  garbage to collect, files being written).

    >>> [rotated(["off", "on", "whole"], r) for r in range(3)]
    [['off', 'on', 'whole'], ['on', 'whole', 'off'], ['whole', 'off', 'on']]
"""
from __future__ import annotations


def rotated(kinds: list, round_: int) -> list:
    shift = round_ % len(kinds)
    return kinds[shift:] + kinds[:shift]


class bare_keras_fit:
    """Within the block, the Keras runner's uninstrumented runs read nothing between steps."""

    def __enter__(self):
        import tensorflow as tf

        from verify.runners.keras import runner as keras_runner

        class ReadsNothing(tf.keras.callbacks.Callback):
            def __init__(self, *args):
                super().__init__()

        self.module, self.original = keras_runner, keras_runner._boundary_callback_class
        keras_runner._boundary_callback_class = lambda: ReadsNothing
        return self

    def __exit__(self, *exc):
        self.module._boundary_callback_class = self.original
