"""The training of the throwaway cases that tests write as modules and run in subprocesses
(they import it with the project root on PYTHONPATH): a quadratic trained by numpy."""
import numpy as np


def record_toy_steps(trace, w, steps: int, drift: float = 0.0, before_step=None):
    """Record step 0's weight, then each step's loss, gradient and weight of `w` trained by
    gradient descent on a quadratic (off by `drift`); `before_step(step)` runs before each
    step (a behaviour that raises or hangs there). Returns `trace`."""
    w = np.asarray(w, np.float32)
    trace.record(0, "weight", "w", w)
    for step in range(1, steps + 1):
        if before_step is not None:
            before_step(step)
        grad = (w * 0.5 + drift).astype(np.float32)
        trace.record(step, "loss", "loss", np.float32((w ** 2).sum() + drift))
        trace.record(step, "grad", "w", grad)
        w = (w - 0.1 * grad).astype(np.float32)
        trace.record(step, "weight", "w", w)
    return trace
