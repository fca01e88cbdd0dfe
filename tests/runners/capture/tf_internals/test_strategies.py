"""The per-device input pipelines of a distributed dataset, built untuned: each replica gets the
same elements in the same order, no pipeline asks for autotuning, and TensorFlow's own function
is back after the block, also when the block raises."""
import pytest

pytestmark = pytest.mark.slow   # builds a MirroredStrategy


def recording_autotune(per_device, seen: list):
    """Wrap the per-device pipeline builder in place now, recording each pipeline's autotune
    option; return what was installed before."""
    current = per_device._create_device_dataset

    def record(*args, **kwargs):
        dataset = current(*args, **kwargs)
        seen.append(dataset.options().autotune.enabled)
        return dataset

    per_device._create_device_dataset = record
    return current


def per_replica_elements(strategy, dataset) -> list:
    return [[value.numpy().tolist() for value in strategy.experimental_local_results(batch)]
            for batch in dataset]


def test_per_device_pipelines_are_untuned_in_the_block_only_and_yield_the_same_elements():
    import tensorflow as tf
    from tensorflow.python.data.ops import multi_device_iterator_ops as per_device

    from verify.runners.capture.devices import mirrored_strategy
    from verify.runners.capture.tf_internals import untuned_per_device_input

    strategy = mirrored_strategy(2)
    dataset = strategy.experimental_distribute_dataset(
        tf.data.Dataset.range(40).shuffle(40, seed=3, reshuffle_each_iteration=False).batch(8))
    original = per_device._create_device_dataset

    as_built_options: list = []
    recording_autotune(per_device, as_built_options)
    try:
        as_built = per_replica_elements(strategy, dataset)
    finally:
        per_device._create_device_dataset = original
    assert as_built_options == [None, None]   # TF's default: autotuned

    untuned_options: list = []
    with untuned_per_device_input():
        installed = recording_autotune(per_device, untuned_options)
        try:
            untuned = per_replica_elements(strategy, dataset)
        finally:
            per_device._create_device_dataset = installed
    assert untuned_options == [False, False]
    assert untuned == as_built and len(untuned) == 5 and len(untuned[0]) == 2
    assert per_device._create_device_dataset is original

    with pytest.raises(RuntimeError, match="the user's step"):
        with untuned_per_device_input():
            raise RuntimeError("the user's step raised")
    assert per_device._create_device_dataset is original


def test_a_tensorflow_without_the_builder_is_left_as_it_is_and_errors_pass_through(monkeypatch):
    from tensorflow.python.data.ops import multi_device_iterator_ops as per_device

    from verify.runners.capture.tf_internals import untuned_per_device_input

    monkeypatch.delattr(per_device, "_create_device_dataset")
    with untuned_per_device_input():
        assert not hasattr(per_device, "_create_device_dataset")
    with pytest.raises(RuntimeError) as raised:
        with untuned_per_device_input():
            raise RuntimeError("the user's step raised")
    assert raised.value.__context__ is None   # not chained to the missing builder
    assert not hasattr(per_device, "_create_device_dataset")
