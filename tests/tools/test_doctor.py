"""`python -m verify doctor`: on CPU every check runs its mechanism with the stand-ins and
passes; each one fails, with its evidence, when its mechanism is broken (a negative control per
check); `--tpu` without a TPU fails the device check at once and runs nothing else."""
import json
import os
import subprocess
import sys
import time

import pytest

from verify.tools.doctor import CHECKS, Check, Setting, run_checks, write_bundle

pytestmark = pytest.mark.slow   # TensorFlow


def run(name, tmp_path):
    (result,) = run_checks(Setting("cpu", "", tmp_path), tuple(c for c in CHECKS
                                                             if c.name == name))
    return result


def test_every_check_passes_on_the_cpu_stand_ins_and_the_bundle_says_so(tmp_path):
    results = run_checks(Setting("cpu", "", tmp_path / "work"))
    assert [(r.name, r.status) for r in results] == [(c.name, "pass") for c in CHECKS], [
        (r.name, r.evidence) for r in results if r.status != "pass"]
    assert "stand-ins" in results[0].evidence
    write_bundle(tmp_path / "bundle", Setting("cpu", "", tmp_path), results)
    document = json.loads((tmp_path / "bundle" / "doctor.json").read_text())
    assert document["stand_ins"] is True and document["environment"]["tensorflow"]
    assert [c["status"] for c in document["checks"]] == ["pass"] * len(CHECKS)
    lines = (tmp_path / "bundle" / "doctor.txt").read_text().splitlines()
    assert len(lines) == len(CHECKS) and all(line.startswith("PASS") for line in lines)


def test_a_tap_that_never_reaches_the_host_fails_host_transfer(tmp_path, monkeypatch):
    from verify.runners.capture import tpu

    monkeypatch.setattr(tpu, "host_transfer", lambda computation, *args: None)
    result = run("host_transfer", tmp_path)
    assert result.status == "fail"
    assert "the host received 0" in result.evidence


def test_a_host_call_that_never_runs_fails_host_call(tmp_path, monkeypatch):
    from tensorflow_estimator.python.estimator.tpu import tpu_estimator

    monkeypatch.setattr(tpu_estimator._OutfeedHostCallHook, "before_run",
                        lambda self, run_context: None)
    result = run("host_call", tmp_path)
    assert result.status == "fail" and "host_call received steps []" in result.evidence


def test_a_read_back_that_reads_nothing_fails_table_readback(tmp_path, monkeypatch):
    from verify.runners.keras import tpu

    monkeypatch.setattr(tpu.TwinReadBack, "read", lambda self: None)
    result = run("table_readback", tmp_path)
    assert result.status == "fail" and "not equal to what was loaded" in result.evidence
    assert "doctor_table" in result.evidence


def test_renamed_embedding_slots_fail_slot_names(tmp_path, monkeypatch):
    from tensorflow_estimator.python.estimator.tpu import _tpu_estimator_embedding

    original = _tpu_estimator_embedding._get_slot_variable_names

    def renamed(scope, var, parameters):
        names = original(scope, var, parameters)
        return names if names is None else type(names)(
            *(f"{n}_renamed" for n in names))

    monkeypatch.setattr(_tpu_estimator_embedding, "_get_slot_variable_names", renamed)
    result = run("slot_names", tmp_path)
    assert result.status == "fail" and "TPUEstimator Adagrad" in result.evidence


def test_tpu_without_a_tpu_fails_at_once_and_runs_nothing_else(tmp_path):
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "verify", "doctor", "--tpu", "--out",
                           str(tmp_path / "bundle")], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.getcwd()}, timeout=300)
    took = time.monotonic() - started
    assert done.returncode == 1, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[0].startswith("FAIL    device") and "no TPU is reachable" in lines[0]
    assert all(line.startswith("NOT RUN") for line in lines[1:len(CHECKS)])
    assert lines[-1].startswith("doctor: FAIL (device, host_transfer")
    document = json.loads((tmp_path / "bundle" / "doctor.json").read_text())
    assert document["stand_ins"] is False and document["checks"][0]["status"] == "fail"
    assert took < 120   # TensorFlow's start-up and the resolver's refusal, nothing trained


def test_each_check_starts_from_the_processs_fresh_state(tmp_path):
    """A switch another run left set (functions run eagerly) is put back before each check."""
    import tensorflow as tf

    from verify.runners.capture.process_state import fresh_state

    fresh_state()   # read before this test sets the switch (a process's first run reads it)
    seen = []

    def reads_the_switch(setting):
        seen.append(tf.config.functions_run_eagerly())
        tf.config.run_functions_eagerly(True)   # left set for the next check
        return "read"

    checks = (Check("first", "reads", reads_the_switch), Check("second", "reads", reads_the_switch))
    tf.config.run_functions_eagerly(True)
    try:
        results = run_checks(Setting("cpu", "", tmp_path), checks)
    finally:
        tf.config.run_functions_eagerly(False)
    assert [r.status for r in results] == ["pass", "pass"]
    assert seen == [False, False]
