"""A custom loop under `--tpu`, on CPU stand-ins (nothing here has run on a TPU): the candidate
("mirrored") loop runs under the strategy `tpu_strategy` returns, its taps sending through
`host_transfer`, and trains bitwise what it trains on CPU; the one-device reference stays on
the host; a TPU whose cores are not the replicas an implementation asks for is refused,
saying which to run."""

import numpy as np
import pytest

from verify.core.inputs import InputFeature

pytestmark = pytest.mark.slow   # trains TensorFlow


@pytest.fixture(scope="module")
def tiny_case(tf_devices):
    from tiny_loop import tiny_loop_case

    return tiny_loop_case()


@pytest.fixture
def tpu_stand_in(monkeypatch):
    """`tpu_strategy` returns a MirroredStrategy over 2 logical CPUs; `host_transfer` counts
    the values sent through it (and sends them, as outside a TPU computation)."""
    from verify.runners.capture import devices, tpu

    calls = {"strategy": 0, "sent": 0}
    original = tpu.host_transfer

    def strategy(name=""):
        calls["strategy"] += 1
        return devices.strategy_for("mirrored", 2, "TPU stand-in")

    def transfer(computation, *args):
        calls["sent"] += 1
        return original(computation, *args)

    monkeypatch.setattr(tpu, "tpu_strategy", strategy)
    monkeypatch.setattr(tpu, "host_transfer", transfer)
    return calls


def bitwise_equal(a, b):
    assert set(a.values.keys()) == set(b.values.keys())
    for key in a.values.keys():
        x, y = a.values[key], b.values[key]
        assert ((x == y) if isinstance(x, (str, InputFeature))
                else np.array_equal(np.asarray(x), np.asarray(y))), key


def test_the_candidate_loop_trains_under_the_tpu_strategy_bitwise_as_on_cpu(tiny_case,
                                                                           tpu_stand_in):
    from verify.runners.run import run_implementation

    mirrored = tiny_case.implementation("mirrored-x2")
    on_cpu = run_implementation(tiny_case, mirrored, steps=4)
    assert tpu_stand_in == {"strategy": 0, "sent": 0}
    on_tpu = run_implementation(tiny_case, mirrored, steps=4, device="tpu")
    assert on_tpu.error is None, on_tpu.error
    assert tpu_stand_in["strategy"] == 1 and tpu_stand_in["sent"] > 0   # through the TPU path
    assert on_tpu.meta.device == "tpu" and on_tpu.meta.replicas == 2
    bitwise_equal(on_cpu, on_tpu)


def test_the_one_device_reference_stays_on_the_host(tiny_case, tpu_stand_in):
    from verify.runners.run import run_implementation

    reference = tiny_case.implementation("reference-x2")
    on_tpu = run_implementation(tiny_case, reference, steps=2, device="tpu")
    assert on_tpu.error is None and tpu_stand_in == {"strategy": 0, "sent": 0}
    bitwise_equal(run_implementation(tiny_case, reference, steps=2), on_tpu)


def test_a_tpu_with_other_core_counts_is_refused_naming_the_replicas_to_run(tiny_case,
                                                                           tpu_stand_in):
    from verify.runners.run import run_implementation

    trace = run_implementation(tiny_case, tiny_case.implementation("mirrored-x4"), steps=1,
                               device="tpu")
    assert "mirrored-x4 asks for 4 replicas; TPUStrategy on this TPU has 2: run the pairs " \
           "of 2 replicas (--replicas 2)" in trace.error
