"""The evaluation a Keras run records after training: the case's evaluation examples through
`model.evaluate`, under the model's strategy (shared by the CPU/GPU and the TPU path)."""
from __future__ import annotations

from verify.core.trace import Trace
from verify.runners.capture.step_record import StepRecorder


def record_evaluation(runner, model, case, trace: Trace, step: int) -> None:
    """Evaluate `model` on the case's evaluation examples (the runner's `dataset_fn`, under
    the model's strategy) and record the loss as step `step`'s `eval/loss`; nothing when the
    case has no evaluation examples."""
    import tensorflow as tf

    if case.eval_examples is None:
        return
    evaluation = tf.keras.utils.experimental.DatasetCreator(
        lambda ctx: runner.dataset_fn(case.eval_examples, ctx, case.batch_size),
        input_options=tf.distribute.InputOptions(experimental_fetch_to_device=False))
    result = model.evaluate(evaluation, steps=runner.eval_steps, return_dict=True, verbose=0)
    StepRecorder(trace).evaluation(step, result)
