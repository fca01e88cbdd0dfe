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


def alternating_rounds(kinds: list, rounds: int, measure, cpu_label: str = "CPU"):
    """`measure(kind)` -> (wall, cpu seconds) for every kind in each of `rounds` rounds, in
    the `rotated` order; each figure and the medians printed. Returns ({kind: walls},
    {kind: cpus}), round by round.

    >>> walls, cpus = alternating_rounds(["a", "b"], 1, lambda kind: (2.0, 1.0))
    round 1 a  wall    2.0 s  CPU    1.0 s  wall / CPU 2.00
    round 1 b  wall    2.0 s  CPU    1.0 s  wall / CPU 2.00
    a  median wall 2.0 s, CPU 1.0 s
    b  median wall 2.0 s, CPU 1.0 s
    >>> walls
    {'a': [2.0], 'b': [2.0]}
    """
    import statistics

    walls = {kind: [] for kind in kinds}
    cpus = {kind: [] for kind in kinds}
    width = max(len(kind) for kind in kinds) + 1
    for round_ in range(rounds):
        for kind in rotated(kinds, round_):
            wall, cpu = measure(kind)
            walls[kind].append(wall)
            cpus[kind].append(cpu)
            print(f"round {round_ + 1} {kind:{width}s} wall {wall:6.1f} s  {cpu_label} "
                  f"{cpu:6.1f} s  wall / {cpu_label} {wall / cpu:.2f}", flush=True)
    for kind in kinds:
        print(f"{kind:{width}s} median wall {statistics.median(walls[kind]):.1f} s, "
              f"{cpu_label} {statistics.median(cpus[kind]):.1f} s")
    return walls, cpus


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
