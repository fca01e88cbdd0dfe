"""The custom-loop case on a tiny synthetic set: the checkpoint round trip is exact, the iteration
styles agree, each negative control is caught where it is wrong and passes where it is
harmless, and a run that TF refuses leaves the process usable.

The tiny case trains 2 epochs over 64 examples, 8 per replica (16 steps on one device, 8 on
two), so the whole module runs in well under a minute on 2 cores.
"""
import contextlib
import dataclasses
from pathlib import Path

import numpy as np
import pytest
from tiny_loop import TINY, differing_values, tiny_loop_case

from cases.custom_loop import CLIP_NORM
from verify.judge.compare import compare_traces
from verify.core.noise_floor import Calibration
from verify.core.tolerances import Tolerance, Tolerances
from verify.judge.verdict import CAUGHT, FAIL, PASS, judge

pytestmark = pytest.mark.slow   # trains TensorFlow

EXACT = Tolerances({q: Tolerance(0.0, 0.0) for q in Tolerances.default().by_quantity})


@pytest.fixture(scope="module")
def run():
    from verify.runners.capture.devices import configure_cpu_replicas

    configure_cpu_replicas()
    from verify.runners.run import run_implementation

    traces = {}

    def run_named(case, name):
        key = (case.name, len(case.examples), name)
        if key not in traces:
            traces[key] = run_implementation(case, case.implementation(name))
        return traces[key]

    def keep(case, plains):   # a calibration's plain runs are these runs: not run twice
        for name, trace in plains.items():
            traces.setdefault((case.name, len(case.examples), name), trace)

    run_named.keep = keep
    return run_named


def tiny_case(train_examples=64):
    return tiny_loop_case(train_examples)


_floors: dict = {}
# The tiny cases' noise floors, measured by `calibrate_case` as `python -m verify calibrate`
# measures a shipped case's, and kept like a shipped case's calibration file: one file per data
# set. Measuring them takes 5 runs per reference (about 25 of this module's runs); a stored one
# is used only for the data and TensorFlow version it was measured on, else measured again.
# `python tests/cases/test_custom_loop_runs.py` measures and writes them.
STORED_FLOORS = Path(__file__).with_name("custom_loop_tiny_floors")
FLOORED_REFERENCES = {64: ("reference-x1", "reference-x2", "mirrored-x2", "clipped-reference-x2"),
                      60: ("reference-x1",)}


def stored_calibration(case, reference):
    """The stored calibration of `reference` on `case`'s data, when it was measured on that data
    with the TensorFlow this process runs; else None."""
    import tensorflow as tf

    stored = Calibration.load(STORED_FLOORS / f"{case.data_digest()}.json")
    if (stored is None or stored.provenance.get("tensorflow") != tf.__version__
            or stored.data_digest != case.data_digest() or reference not in stored.references):
        return None
    return stored


def calibration(run, case, reference):
    """The tiny case's own noise floor of `reference` (`python -m verify calibrate` measures
    it the same way), once per data set and reference: a control must be caught beyond it.
    Stored floors are used where they apply (`stored_calibration`); when measured here, the
    calibration's plain run of `reference` is the one `run` then returns."""
    from verify.tools.calibration import calibrate_case

    key = (case.data_digest(), reference)
    if key not in _floors:
        _floors[key] = stored_calibration(case, reference)
    if _floors[key] is None:
        plains = {}
        _floors[key] = calibrate_case(case, references=[reference], log=lambda line: None,
                                      plains=plains)
        run.keep(case, plains)
    return _floors[key]


def write_stored_calibrations():
    """Measure the floors this module judges with and write them under STORED_FLOORS."""
    from verify.runners.capture.devices import configure_cpu_replicas
    from verify.tools.calibration import calibrate_case

    configure_cpu_replicas()
    STORED_FLOORS.mkdir(exist_ok=True)
    for examples, references in FLOORED_REFERENCES.items():
        case = tiny_case(examples)
        measured = calibrate_case(case, references=list(references))
        measured.save(STORED_FLOORS / f"{case.data_digest()}.json")
        print(f"{examples} examples: {', '.join(references)} -> {case.data_digest()}.json")


def verdict(run, case, reference, candidate, expect="declared"):
    """The pair judged as the suite judges it: the case's tolerances, capped at the case's
    multiple of the reference's floor."""
    floors = calibration(run, case, reference)
    rows = compare_traces(run(case, reference), run(case, candidate), case.tolerances,
                          floor=floors.floor_of(reference), multiple=case.tolerance_multiple)
    return judge(rows, case.implementation(candidate).expect if expect == "declared" else expect)


def test_a_loss_tf_refuses_fails_while_tracing_and_later_runs_still_pass(run):
    case = tiny_case()
    failed = run(case, "control-sum-over-batch-size-x2")
    assert failed.error.startswith(
        "ValueError: Please use `tf.keras.losses.Reduction.SUM` or "
        "`tf.keras.losses.Reduction.NONE`")
    assert verdict(run, case, "reference-x2", "control-sum-over-batch-size-x2").status == CAUGHT
    # Collectives still work in this process afterwards.
    assert verdict(run, case, "reference-x2", "mirrored-x2").status == PASS


def test_checkpoint_round_trip_restores_weights_slots_and_accuracy_exactly(run):
    case = tiny_case()
    trained, restored = run(case, "mirrored-x2"), run(case, "mirrored-x2-restored")
    last = trained.steps()[-1]
    rows = compare_traces(trained, restored, EXACT)
    at_last = rows[rows["step"] == last]
    assert set(at_last["quantity"]) == {"loss", "input", "grad", "slot", "weight", "metric"}
    assert at_last["passed"].all(), at_last[~at_last["passed"]][["tensor", "reason"]]
    assert len(at_last[at_last["quantity"] == "slot"]) == 16    # m and v of 8 variables
    assert restored.get(last, "metric", "test/accuracy") == trained.get(last, "metric",
                                                                        "test/accuracy")


def test_restoring_the_model_only_is_caught_at_the_slots(run):
    case = tiny_case()
    trained, control = run(case, "mirrored-x2"), run(case, "control-restore-model-only-x2")
    last = trained.steps()[-1]
    for name in ("conv1/kernel", "dense2/bias"):
        np.testing.assert_array_equal(control.get(last, "weight", name),
                                      trained.get(last, "weight", name))
        assert not control.get(last, "slot", f"{name}/m").any()
        assert trained.get(last, "slot", f"{name}/m").any()
    result = verdict(run, case, "mirrored-x2", "control-restore-model-only-x2")
    assert result.status == CAUGHT and result.divergence.step == last


def test_iteration_styles_train_the_same_numbers(run):
    case = tiny_case()
    for style in ("mirrored-x2-iterator", "mirrored-x2-epoch-function"):
        assert verdict(run, case, "mirrored-x2", style).status == PASS, style
    rows = compare_traces(run(case, "mirrored-x2"), run(case, "mirrored-x2-iterator"), EXACT)
    assert rows["passed"].all()   # same tf.function, same batches: bit for bit
    epoch = run(case, "mirrored-x2-epoch-function")
    assert epoch.steps() == run(case, "mirrored-x2").steps()
    assert {k.quantity for k in epoch.keys_at(3)} == {"input", "loss", "grad", "slot", "weight"}


def test_input_digests_see_the_global_batch(run):
    """The replica batches, concatenated in replica order, are the reference's global batch;
    a reference with another global batch size differs from the first step."""
    case = tiny_case()
    rows = compare_traces(run(case, "reference-x1"), run(case, "mirrored-x2"), case.tolerances)
    first = rows[(rows["step"] == 1) & (rows["quantity"] == "input")]
    assert not first["passed"].any()


def test_reduce_mean_is_harmless_on_one_device_only_while_batches_are_full(run):
    full = tiny_case(64)
    assert full.implementation("reduce-mean-x1").expect is None
    assert verdict(run, full, "reference-x1", "reduce-mean-x1").status == PASS
    partial = tiny_case(60)   # 7 batches of 8, then one of 4
    expect = partial.implementation("reduce-mean-x1").expect
    assert (expect.step, expect.quantity) == (8, "loss")
    assert verdict(run, partial, "reference-x1", "reduce-mean-x1").status == CAUGHT
    assert verdict(run, partial, "reference-x1", "reduce-mean-x1", expect=None).status == FAIL


def test_loss_scaling_and_loss_tracking_controls_are_caught_where_declared(run):
    case = tiny_case()
    scaled = verdict(run, case, "reference-x2", "control-reduce-mean-x2")
    assert scaled.status == CAUGHT
    assert (scaled.divergence.step, scaled.divergence.quantity) == (1, "loss")
    tracked = verdict(run, case, "reference-x2", "control-mean-metric-loss-x2")
    assert tracked.status == CAUGHT
    assert (tracked.divergence.quantity, tracked.divergence.tensor) == ("metric", "train/loss")
    trace = run(case, "control-mean-metric-loss-x2")
    step = tracked.divergence.step
    true_loss = run(case, "reference-x2").get(step, "metric", "train/loss")
    np.testing.assert_allclose(trace.get(step, "metric", "train/loss"), true_loss / 2, rtol=1e-5)


def test_mirrored_strategies_of_different_sizes_share_a_process():
    import tensorflow as tf

    from verify.runners.capture.devices import configure_cpu_replicas, mirrored_strategy

    configure_cpu_replicas()
    for replicas in (2, 4, 2):
        strategy = mirrored_strategy(replicas)
        summed = strategy.reduce(tf.distribute.ReduceOp.SUM, strategy.run(
            lambda: tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group + 1,
                            tf.float32)), axis=None)
        assert float(summed) == replicas * (replicas + 1) / 2


def test_slot_names_of_new_keras_optimizers_map_to_their_variables():
    from verify.runners.capture.tf_internals import keras_optimizer_slots as optimizer_slot_variables

    @dataclasses.dataclass
    class Named:
        name: str

    class Optimizer:
        variables = [Named("iteration:0"), Named("while/Adam/m/conv2d/kernel:0"),
                     Named("v/conv2d/kernel:0"), Named("m/model/dense/kernel:0"),
                     Named("m/dense/kernel:0")]

    found = optimizer_slot_variables(Optimizer(), {"conv2d/kernel": None, "dense/kernel": None,
                                                   "model/dense/kernel": None})
    assert {k: v.name for k, v in found.items()} == {
        "conv2d/kernel::m": "while/Adam/m/conv2d/kernel:0",
        "conv2d/kernel::v": "v/conv2d/kernel:0",
        "model/dense/kernel::m": "m/model/dense/kernel:0",
        "dense/kernel::m": "m/dense/kernel:0"}


def test_loop_runner_and_the_tutorial_loop_reject_unknown_settings():
    from cases.custom_loop.seed_loop import Variant
    from verify import LoopRunner

    with pytest.raises(ValueError, match="strategy must be one of"):
        LoopRunner(build_loop=None, strategy="parameter_server")
    with pytest.raises(ValueError, match="iteration must be one of"):
        Variant(iteration="while")


def test_a_user_step_that_clips_after_summing_over_replicas_trains_like_one_device(run):
    """The user's own step (clipping the global gradient) runs unchanged and is observed: the
    gradients recorded are the clipped ones the optimizer applied."""
    case = tiny_case()
    assert verdict(run, case, "clipped-reference-x2", "clipped-mirrored-x2").status == PASS
    clipped, plain = run(case, "clipped-reference-x2"), run(case, "reference-x2")
    norm = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum())
                       for k, g in clipped.values.items() if k.quantity == "grad" and k.step == 1))
    plain_norm = np.sqrt(sum(float((g.astype(np.float64) ** 2).sum())
                             for k, g in plain.values.items() if k.quantity == "grad"
                             and k.step == 1))
    assert plain_norm > CLIP_NORM and abs(norm - CLIP_NORM) < 1e-5, (plain_norm, norm)


@pytest.mark.parametrize("name", ["reference-x1", "mirrored-x2", "mirrored-x2-epoch-function"])
def test_observing_the_users_loop_leaves_its_numbers_bitwise_unchanged(run, name):
    """The user's loop with the taps and without them: weights and Adam slots at every epoch
    end are bitwise equal, and so are the epoch metrics."""
    from verify.runners.run import run_implementation

    case = tiny_case()
    observed = run(case, name)
    plain = run_implementation(case, case.implementation(name), capture_steps=False)
    assert plain.error is None and observed.error is None
    boundaries = plain.steps()
    assert len(boundaries) == TINY.epochs and len(observed.steps()) == boundaries[-1]
    for step in boundaries:
        keys = [k for k in plain.keys_at(step) if k.quantity in ("weight", "slot", "metric")]
        assert len(keys) >= 8 + 16 + 4
        for key in keys:
            assert np.array_equal(plain.values[key], observed.values[key]), key


@contextlib.contextmanager
def each_device_skipping_its_first_batch():
    """A deliberately different per-device pipeline: the check below must see it."""
    from tensorflow.python.data.ops import multi_device_iterator_ops as per_device

    original = per_device._create_device_dataset
    per_device._create_device_dataset = lambda *a, **k: original(*a, **k).skip(1)
    try:
        yield
    finally:
        per_device._create_device_dataset = original


def recording_untuned(seen: list):
    """`untuned_per_device_input` as a run enters it, recording the autotune option of each
    per-device pipeline built inside (what the run itself builds, not a separate check)."""
    from tensorflow.python.data.ops import multi_device_iterator_ops as per_device

    from verify.runners.capture.tf_internals import untuned_per_device_input

    @contextlib.contextmanager
    def recorded():
        with untuned_per_device_input():
            untuned = per_device._create_device_dataset

            def record(*args, **kwargs):
                dataset = untuned(*args, **kwargs)
                seen.append(dataset.options().autotune.enabled)
                return dataset

            per_device._create_device_dataset = record
            try:
                yield
            finally:
                per_device._create_device_dataset = untuned
    return recorded


def test_untuned_per_device_input_trains_bitwise_what_tensorflows_own_pipelines_train(
        monkeypatch):
    """Every run builds its per-device input pipelines untuned
    (`tf_internals.untuned_per_device_input`, entered by `run_implementation`): inputs, losses,
    gradients, weights, slots and metrics at every step are bitwise those of the same run with
    TensorFlow's own pipelines; pipelines that feed the devices otherwise are caught by the
    same check."""
    from verify.runners import run as run_module
    from verify.runners.capture.devices import configure_cpu_replicas
    from verify.runners.run import run_implementation

    configure_cpu_replicas()
    case = tiny_case()
    seen: list = []
    monkeypatch.setattr(run_module, "untuned_per_device_input", recording_untuned(seen))
    untuned = run_implementation(case, case.implementation("mirrored-x2"))
    # the run entered it: each epoch's train and test iterators, one pipeline per replica
    assert seen and set(seen) == {False} and len(seen) % 2 == 0, seen
    monkeypatch.setattr(run_module, "untuned_per_device_input", contextlib.nullcontext)
    as_built = run_implementation(case, case.implementation("mirrored-x2"))
    assert untuned.error is None and as_built.error is None
    assert len(untuned.steps()) == 8 and {k.quantity for k in untuned.values} >= {
        "input", "loss", "grad", "weight", "slot", "metric"}
    assert differing_values(untuned, as_built) == []
    monkeypatch.setattr(run_module, "untuned_per_device_input",
                        each_device_skipping_its_first_batch)
    skipped = run_implementation(case, case.implementation("mirrored-x2"))
    assert skipped.error is None
    assert differing_values(untuned, skipped)[0].step == 1


if __name__ == "__main__":
    write_stored_calibrations()
