"""Every mechanism the --tpu path captures with, run on CPU.

A TPU is not reachable here, so the TPU path is built from mechanisms with CPU counterparts, and
these tests run each one: the TF1 `host_call` capture (the same function `use_tpu=False` runs
through `create_cpu_hostcall`), the input tap, the checkpoint reads of tables and slots, the TF2
checkpoint read-back into a twin built under the default strategy, and the whole TPU code path
of both runners with the two functions of `verify.runners.capture.tpu` that pick up a TPU replaced by
CPU stand-ins. What the stand-ins cannot show (the embedding engine itself) is listed in
docs/how-to/tpu.md.
"""
import dataclasses

import numpy as np
import pytest

from verify.runners.lazy import LazyRunner
from verify.core.inputs import InputFeature
from verify.core.trace import SparseRows
from verify.runners.run import run_implementation

pytestmark = pytest.mark.slow   # trains TensorFlow


@pytest.fixture(scope="module")
def case(tf_devices):
    from cases.tpu_embedding import CASE

    return CASE


@pytest.fixture(scope="module")
def recommender(tf_devices):
    from cases.recommender import cases
    from verify.core.case import SuiteOptions

    return {c.name: c for c in cases(SuiteOptions())}


@pytest.fixture
def cpu_stand_ins(monkeypatch):
    """The two functions that pick up a TPU, replaced: TF1 runs with use_tpu=False, TF2 under
    the default strategy. Everything else of the --tpu path runs as it would on a TPU."""
    import tensorflow as tf

    from verify.runners.capture import tpu

    monkeypatch.setattr(tpu, "estimator_cluster", lambda name: (None, False))
    monkeypatch.setattr(tpu, "tpu_strategy", lambda name: tf.distribute.get_strategy())


def host_call_runner(implementation):
    runner = implementation.runner
    runner = runner.resolve() if isinstance(runner, LazyRunner) else runner
    return dataclasses.replace(implementation, runner=dataclasses.replace(
        runner, capture="host_call"))


def differences(a, b, keys) -> list:
    """The keys whose values are not bitwise equal (dtype, shape and bytes)."""
    out = []
    for key in keys:
        x, y = a.values[key], b.values[key]
        if isinstance(x, SparseRows):
            same = (isinstance(y, SparseRows) and x.dense_shape == y.dense_shape
                    and x.rows.dtype == y.rows.dtype and np.array_equal(x.ids, y.ids)
                    and np.array_equal(x.rows, y.rows))
        elif isinstance(x, (str, InputFeature)):   # an input digest or its per-example form
            same = x == y
        else:
            same = (not isinstance(y, (str, SparseRows)) and x.dtype == y.dtype
                    and x.shape == y.shape and np.array_equal(x, y))
        if not same:
            out.append(key)
    return out


def tensors(trace, quantity):
    return {k.tensor for k in trace.values if k.quantity == quantity}


def steps_of(trace, quantity, tensor):
    return sorted(k.step for k in trace.values if k.quantity == quantity and k.tensor == tensor)


# ---- TF1: host_call, input tap, checkpoints ----

def test_host_call_capture_equals_the_hook_capture_bitwise(case, monkeypatch):
    """The tpu_embedding reference captured through host_call (run by create_cpu_hostcall),
    the input tap and a checkpoint every step equals its SessionRunHook capture, value for
    value, and really came through those mechanisms."""
    from verify.runners.capture.host_call import HostCallCapture

    calls = {"host_call": 0, "checkpoint": 0}
    record_step, read_checkpoint = HostCallCapture._record_step, HostCallCapture._read_checkpoint

    def counting_step(self, step, values):
        calls["host_call"] += 1
        return record_step(self, step, values)

    def counting_checkpoint(self, reader, step, request):
        calls["checkpoint"] += 1
        return read_checkpoint(self, reader, step, request)

    monkeypatch.setattr(HostCallCapture, "_record_step", counting_step)
    monkeypatch.setattr(HostCallCapture, "_read_checkpoint", counting_checkpoint)
    hook = run_implementation(case, case.implementation("tf1"), steps=20)
    host_call = run_implementation(case, host_call_runner(case.implementation("tf1")), steps=20)
    assert hook.error is None and host_call.error is None
    assert host_call.meta.details["capture"] == "host_call"
    assert calls == {"host_call": 20, "checkpoint": 21}   # every step; step 0 and every step
    assert set(hook.values) == set(host_call.values)
    assert len(hook.values) == 264
    assert {"input", "loss", "grad", "slot", "weight", "metric"} == {
        k.quantity for k in hook.values}
    assert differences(hook, host_call, hook.values) == []
    assert isinstance(host_call.get(1, "grad", "embedding/sparse_feature"), SparseRows)


def test_host_call_capture_equals_the_hook_capture_with_shared_tables(recommender):
    """Three tables (one shared by two features), FTRL's two slots, sparse features with
    empty rows: the host_call capture equals the hook's bitwise."""
    case = recommender["recommender_ftrl"]
    hook = run_implementation(case, case.implementation("tf1"), steps=6)
    host_call = run_implementation(case, host_call_runner(case.implementation("tf1")), steps=6)
    assert hook.error is None and host_call.error is None
    assert set(hook.values) == set(host_call.values)
    assert {"embedding/item/accumulator", "embedding/item/linear"} <= tensors(hook, "slot")
    assert differences(hook, host_call, hook.values) == []


def test_the_tf1_tpu_path_on_cpu(case, cpu_stand_ins):
    """device="tpu" with use_tpu=False standing in: tables and their slots are read from
    checkpoints every K steps and at the last, their gradients are declared not captured
    (and not sent), the loop runs gcd(iterations_per_loop, K) steps, and every other value
    equals the hook capture bitwise."""
    hook = run_implementation(case, case.implementation("tf1"), steps=7)
    tpu = run_implementation(case, case.implementation("tf1"), steps=7, device="tpu",
                             tables_every=3)
    assert hook.error is None and tpu.error is None
    table, slot = "embedding/sparse_feature", "embedding/sparse_feature/accumulator"
    assert steps_of(tpu, "weight", table) == [0, 3, 6, 7]
    assert steps_of(tpu, "slot", slot) == [3, 6, 7]
    assert steps_of(tpu, "grad", table) == []
    assert list(tpu.meta.not_captured["grad"]) == [table]
    assert tpu.meta.read_every == {"weight": {table: 3}, "slot": {slot: 3}}
    assert tpu.meta.details["iterations_per_loop"] == 1
    assert steps_of(tpu, "weight", "dense/kernel") == list(range(8))
    missing = set(hook.values) - set(tpu.values)
    assert {(k.quantity, k.tensor) for k in missing} == {
        ("grad", table), ("weight", table), ("slot", slot)}
    assert not set(tpu.values) - set(hook.values)
    assert differences(hook, tpu, tpu.values) == []


def test_engine_slot_names_hold_the_slots_in_a_cpu_checkpoint_for_adagrad_and_ftrl(
        case, recommender, tmp_path):
    """On a TPU the tables' slots are read under the names TPUEstimator gives the engine's
    slots (`<table>/Adagrad`, `/Ftrl`, `/Ftrl_1`); for Adagrad and FTRL those are the names
    the CPU model_fn optimizer gives them, so a CPU checkpoint holds the same values there.
    Adam's engine names (`/Adam/m`) differ from the CPU optimizer's (`/Adam`, `/Adam_1`)."""
    import tensorflow as tf

    from verify.runners.capture.tf_internals import tpu_embedding_slot_names

    tf1 = tf.compat.v1
    checks = [(case, "dense_features/sparse_feature_embedding/embedding_weights",
               tf1.tpu.experimental.AdagradParameters(0.05), "accumulator"),
              (recommender["recommender_ftrl"],
               "dense_features/query_terms_embedding/embedding_weights",
               tf1.tpu.experimental.FtrlParameters(0.05), "accumulator")]
    for n, (c, table, parameters, _) in enumerate(checks):
        workdir = tmp_path / str(n)
        trace = run_implementation(c, c.implementation("tf1"), steps=2, workdir=workdir)
        reader = tf.train.load_checkpoint(str(workdir / "tf1" / "model"))
        names = tpu_embedding_slot_names(table, parameters)
        assert names and all(reader.has_tensor(name) for name in names)
        canonical = c.implementation("tf1").names.canonical_of(table)[0]
        for name, slot in names.items():
            slot = c.implementation("tf1").slot_names.get(slot, slot)
            assert np.array_equal(reader.get_tensor(name),
                                  trace.get(2, "slot", f"{canonical}/{slot}")), name
    adam = tpu_embedding_slot_names("t", tf1.tpu.experimental.AdamParameters(0.1))
    assert adam == {"t/Adam/m": "m", "t/Adam/v": "v"}


# ---- TF2: checkpoint read-back into the twin ----

@pytest.mark.parametrize("which", ["tpu_embedding:tf2", "recommender_adam:tf2-tfrs-model",
                                   "recommender_ftrl:tf2"])
def test_checkpoint_read_back_equals_direct_reads(case, recommender, tmp_path, which):
    """Train a model, save its checkpoint and restore it into its twin (built apart, as the
    TPU path builds it under the default strategy): the twin's tables and every table slot
    (Adagrad accumulator, Adam m/v, FTRL accumulator/linear) equal the model's bitwise; before
    the read-back they did not."""
    import tensorflow as tf

    from verify.core.names import native_name
    from verify.runners.keras.tpu import TwinReadBack, twin_tables

    name, implementation = which.split(":")
    c = case if name == "tpu_embedding" else recommender[name]
    runner = c.implementation(implementation).runner
    tf.keras.backend.clear_session()
    twin = runner.build_model(1)
    tf.keras.backend.clear_session()
    model = runner.build_model(1)
    data = runner.dataset_fn(c.examples, tf.distribute.InputContext(), c.batch_size)
    model.fit(data, epochs=1, steps_per_epoch=3, verbose=0)
    model_tables, model_slots = twin_tables(model)
    tables, slots = twin_tables(twin)
    assert set(tables) == set(model_tables) and set(slots) == set(model_slots)
    assert len(slots) >= len(tables) >= 1
    before = [n for n in tables if np.array_equal(tables[n].numpy(), model_tables[n].numpy())]
    assert before == []   # the twin starts elsewhere: a read-back that did nothing would fail
    TwinReadBack(model, twin, tmp_path).read()
    for n in tables:
        assert np.array_equal(tables[n].numpy(), model_tables[n].numpy()), n
    for n in slots:
        assert np.array_equal(slots[n].numpy(), model_slots[n].numpy()), n
    dense = {native_name(v): v for v in model.trainable_variables}
    for v in twin.trainable_variables:
        assert np.array_equal(v.numpy(), dense[native_name(v)].numpy())


def test_a_read_back_into_a_twin_of_another_model_raises(case, recommender, tmp_path):
    """A twin the checkpoint does not fit (another model) is an error, never stale values."""
    import tensorflow as tf

    from verify.runners.keras.tpu import TwinReadBack

    tf.keras.backend.clear_session()
    model = case.implementation("tf2").runner.build_model(1)
    other = recommender["recommender_adam"].implementation("tf2").runner.build_model(1)
    with pytest.raises((AssertionError, ValueError)):   # unmatched objects, or shapes
        TwinReadBack(model, other, tmp_path).read()


# ---- TF2: the TPU code path with the default strategy standing in ----

@pytest.mark.parametrize("which", ["tpu_embedding:tf2", "recommender_adam:tf2-tfrs-model"])
def test_the_tf2_tpu_path_on_cpu(case, recommender, cpu_stand_ins, which):
    """device="tpu" with the default strategy standing in for TPUStrategy: the model's own
    train_step under the taps (their host transfer through outside_compilation) gives the dense
    part every step, the twin's read-back the tables and slots every K steps and at the last,
    step 0 comes through the twin, table gradients are declared not captured; every value
    equals the ordinary capture bitwise."""
    name, implementation = which.split(":")
    c = case if name == "tpu_embedding" else recommender[name]
    impl = c.implementation(implementation)
    plain = run_implementation(c, impl, steps=10)
    tpu = run_implementation(c, impl, steps=10, device="tpu", tables_every=5)
    assert plain.error is None and tpu.error is None
    tables = set(tpu.meta.not_captured["grad"])
    assert tables and tables == set(tpu.meta.read_every["weight"])
    assert tpu.meta.details["table_reads"] == 3            # steps 0, 5 and 10
    assert tpu.meta.details["steps_per_execution"] in (1, 5)
    for table in tables:
        assert steps_of(tpu, "weight", table) == [0, 5, 10]
        assert steps_of(tpu, "grad", table) == []
    missing = {(k.quantity, k.tensor) for k in set(plain.values) - set(tpu.values)}
    assert {t for q, t in missing if q == "grad"} == tables
    assert {t for q, t in missing if q == "weight"} == tables
    assert {t.rsplit("/", 1)[0] for q, t in missing if q == "slot"} == tables
    assert not set(tpu.values) - set(plain.values)
    assert differences(plain, tpu, tpu.values) == []


def test_the_tf2_tpu_path_uninstrumented_on_cpu(case, cpu_stand_ins):
    """capture_steps=False under the TPU path: its own steps_per_execution (10), every
    variable and slot read at execution ends (tables through the twin), equal to the
    ordinary capture there."""
    impl = case.implementation("tf2-spe10")
    plain = run_implementation(case, case.implementation("tf2"), steps=20)
    tpu = run_implementation(case, impl, steps=20, device="tpu")
    assert tpu.error is None and tpu.steps() == [10, 20] and tpu.meta.capture_every == 10
    assert tensors(tpu, "weight") == set(case.initial_values)
    assert len(tensors(tpu, "slot")) == 3
    assert differences(plain, tpu, tpu.values) == []


# ---- a whole --tpu session with the stand-ins ----

def test_a_tpu_session_on_cpu_judges_pairs_and_lists_what_a_tpu_cannot_show(
        tmp_path, cpu_stand_ins, monkeypatch):
    """The session of `pytest verify/ --tpu` with the stand-ins (and a resolver that
    answers): the faithful pairs PASS with the table gradients listed as not captured, never
    counted; controls are judged with their TPU expectations."""
    import pandas as pd

    from verify.runners.case_sources import load_cases, resolve_sources
    from verify.core.case import SuiteOptions
    from verify.runners.capture import devices
    from verify.session.parity_session import ParitySession

    monkeypatch.setattr(devices, "resolve_tpu", lambda name="": object())
    options = SuiteOptions(device="tpu")
    session = ParitySession(
        options, tmp_path, "run-1",
        lambda broken: load_cases(resolve_sources(["cases"], None), options, broken),
        case_names=["tpu_embedding"], history_dir=None)
    wanted = {"tf2", "tf2-spe10", "control-combiner-sum", "control-initializer",
              "control-layer-optimizer"}
    specs = [s for s in session.pairs() if s.reference == "tf1" and s.candidate in wanted]
    session.selected, session.collected = [s.id for s in specs], True
    session.kept_pairs = specs   # what the plugin keeps after selection
    verdicts = {s.candidate: session.check(s) for s in specs}
    session.write_report()
    assert {n: r.verdict.status for n, r in verdicts.items()} == {
        "tf2": "PASS", "tf2-spe10": "PASS", "control-combiner-sum": "CAUGHT",
        "control-initializer": "CAUGHT", "control-layer-optimizer": "MISSED"}
    # the stand-in trains the tables with the compile optimizer, as CPU does: the control's TPU
    # expectation (the layer's optimizer moves the table at step 1) is in force and not met
    assert "expected at step 1 weight embedding/*" in \
        verdicts["control-layer-optimizer"].verdict.message
    assert "20 values not captured on the device" in verdicts["tf2"].verdict.message
    summary = pd.read_csv(tmp_path / "summary.csv")
    faithful = summary[summary["candidate"] == "tf2"].iloc[0]
    assert faithful["not_captured"] == ("grad embedding/sparse_feature (20 steps): not "
                                        "captured on TPU by tf1 and tf2")
    drift = pd.read_csv(tmp_path / "drift.csv.gz")
    unseen = drift[drift["reason"].fillna("").str.startswith("not captured on TPU")]
    assert len(unseen) == 20 * 4   # 20 steps of each pair captured every step
    assert unseen["passed"].all() and unseen["max_abs"].isna().all()
    text = (tmp_path / "summary.md").read_text()
    assert "### Not captured on the device (informational, not compared)" in text
    assert "on tpu" in text   # which optimizer trained the tables: the embedding one
