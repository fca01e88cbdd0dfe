"""Runs are independent: what one run leaves in the process (a Keras mixed-precision policy,
floatx, XLA JIT, seeds) never reaches the next run's numbers."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["keras", "loop", "estimator"])
def test_a_run_after_one_that_changed_process_state_is_bitwise_the_fresh_processs_run(
        kind, tmp_path):
    out = tmp_path / "digests.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "isolation_run.py"), kind,
                           str(out)], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(out.read_text())
    # the polluter's leftovers were seen and put back after its run
    assert {"keras mixed-precision global policy", "keras floatx",
            "tf.config.optimizer jit"} <= set(found["reset"])
    assert not found["fresh"].startswith("error"), found["fresh"]
    assert found["isolated"] == found["fresh"]
    # negative control: without the reset the same run trains other numbers (or raises)
    assert found["unisolated"] != found["fresh"]


@pytest.mark.slow   # starts TensorFlow: the devices are configured first (conftest)
def test_every_switch_reads_back_what_it_wrote():
    """Each switch's setter takes what its getter returned (a reset is a round trip)."""
    tf = pytest.importorskip("tensorflow")
    from verify.runners.capture.process_state import fresh_state, starting_fresh, switches

    fresh = dict(fresh_state())
    starting_fresh()   # whatever tests before this one in the process left behind
    assert starting_fresh() == []
    tf.keras.mixed_precision.set_global_policy("mixed_float16")
    tf.config.optimizer.set_experimental_options({"layout_optimizer": False})
    tf.random.set_seed(5)
    changed = starting_fresh()
    assert {"keras mixed-precision global policy", "tf.config.optimizer experimental options",
            "tf.random global seed"} <= set(changed)
    assert {s.name: s.read() for s in switches()}.keys() >= fresh.keys()
    assert tf.keras.mixed_precision.global_policy().name == "float32"
    assert tf.config.optimizer.get_experimental_options().get("layout_optimizer") is None
    assert starting_fresh() == []


def _distributed_run(order: str, tmp_path) -> dict:
    out = tmp_path / f"{order}.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "distributed_isolation_run.py"),
                           order, str(out)], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_loop_cases_of_different_models_share_a_process_at_2_and_4_replicas(tmp_path):
    """Small then large then small again in one process, each pair bitwise its run in a fresh
    process (the large case's: a process of its own), while a run in between set a strategy
    for the whole process; without fresh collective keys the second model's 2-replica run
    fails on the first's collectives (the negative control)."""
    found = _distributed_run("sequence", tmp_path)
    fresh_large = _distributed_run("fresh-large", tmp_path)["first"]
    assert all(pair["verdict"] == "PASS" for pair in [*found["first"].values(),
                                                      *fresh_large.values()]), found
    assert found["again"] == found["first"]      # small: after large, as in a fresh process
    assert found["after"] == fresh_large         # large: after small, as in a fresh process
    assert found["leaking_error"] is None
    assert "tf.distribute global strategy" in found["reset_after_leak"]
    # negative control: the same keys again, and the large model's collectives meet the small
    # model's shapes (or the executor they aborted)
    errors = found["control_errors"]
    assert any(e and ("Shape mismatch" in e or "aborted" in e or "Cancelled" in e)
               for e in errors), errors
