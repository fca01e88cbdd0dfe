"""The checkpoint bridge: a TF1 checkpoint carried into the TF2 model through the case's name
maps (verify.checkpoint), every bad input refused with one error and nothing written, and the
resume pairs' judging."""
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from verify.checkpoint import STEP, ConversionError, Entry, Side, check_fit
from verify.core.case import PairSpec
from verify.core.trace import Trace
from verify.judge import judge_pair


def side(name, entries, slots=(), problems=()):
    return Side(name, {n: Entry(n, native, shape) for n, (native, shape) in entries.items()},
                tuple(slots), list(problems))


def test_check_fit_lists_every_name_that_does_not_map_on_each_side_in_one_error():
    source = side("tf1", {"w": ("dense/kernel", (7, 1)), "w/m": ("dense/kernel/Adam", (7, 1)),
                          "w/v": ("dense/kernel/Adam_1", (7, 1)), "t": ("table", (12, 5)),
                          "extra": ("extra/embedding_weights", (3, 2)), STEP: ("global_step", ())},
                  slots=("m", "v"), problems=["in the checkpoint, mapped to nothing (1): junk ()"])
    target = side("tf2", {"w": ("dense/kernel", (7, 1)), "w/accumulator": ("slot of w", (7, 1)),
                          "t": ("tpu_embedding/table_0", (10, 5)), STEP: ("iterations", ())},
                  slots=("accumulator",))
    with pytest.raises(ConversionError) as raised:
        check_fit(source, target)
    message = str(raised.value)
    for name in ("w/m <- dense/kernel/Adam", "w/v <- dense/kernel/Adam_1",
                 "extra <- extra/embedding_weights", "w/accumulator -> slot of w",
                 "t: table (12, 5), tpu_embedding/table_0 (10, 5)", "junk",
                 "tf1 keeps [m, v], tf2 keeps [accumulator]", "nothing was written"):
        assert name in message
    assert message.count("\n") == 5   # the headline and one line per kind of problem


def test_check_fit_accepts_sides_that_map_both_ways():
    entries = {"w": ("dense/kernel", (7, 1)), "w/accumulator": ("x", (7, 1)), STEP: ("s", ())}
    check_fit(side("tf1", entries, ("accumulator",)), side("tf2", entries, ("accumulator",)))


def test_a_resumed_pair_is_not_attributed_against_an_oracle_that_trains_from_the_start():
    reference, candidate = Trace("tf1-resume"), Trace("tf2-resume")
    for trace in (reference, candidate):
        trace.record(1, "loss", "loss", np.float32(0.5))
        trace.meta.details["resumed_from"] = {"implementation": "tf1", "steps": 1}

    def traces(name):
        if name == "oracle":
            raise AssertionError("the oracle's trace is not needed")
        return {"tf1-resume": reference, "tf2-resume": candidate}[name]

    result = judge_pair(PairSpec("demo", "tf1-resume", "tf2-resume", oracle="oracle"), traces,
                        None)
    assert result.record.verdict == "PASS"
    assert result.record.attribution == ("not attributed: the pair resumes from tf1's "
                                            "checkpoint; the oracle (oracle) trains from the "
                                            "initial values")


# ---- with TensorFlow: a real TF1 checkpoint of each case, converted ----

K = 3   # steps the TF1 reference trains before its checkpoint is converted


def tf1_checkpoint(case, directory: Path, steps: int = K) -> Path:
    """Train the case's tf1 for `steps` and keep its model_dir: the checkpoint a TF1 user has."""
    from verify.core.runner import RunRequest

    tf1 = case.implementation("tf1")
    checkpoint = directory / "tf1-model"
    tf1.runner.run(RunRequest(case=case, implementation=tf1, steps=steps,
                              initial_values=tf1.names.to_native(case.initial_values),
                              device="cpu", workdir=directory / "work", capture_steps=False,
                              checkpoint_dir=checkpoint))
    return checkpoint


def rewrite_checkpoint(source: Path, out: Path, *, drop=(), rename=None, replace=None,
                       partitioned=()) -> Path:
    """A TF1 checkpoint with the values of `source`, some keys dropped, renamed or replaced, and
    the keys in `partitioned` saved in 2 parts (as TPU hosts save a table)."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(source)))
    values = {k: reader.get_tensor(k) for k in reader.get_variable_to_shape_map() if k not in drop}
    values.update(replace or {})
    values = {(rename or {}).get(k, k): v for k, v in values.items()}
    with tf.Graph().as_default():
        variables = []
        for name, value in values.items():
            value = np.asarray(value)

            def initial(shape, dtype=None, partition_info=None, value=value):
                start = partition_info.single_offset(shape) if partition_info else 0
                return tf.constant(value[start:start + shape[0]] if partition_info else value,
                                   dtype)

            variables.append(tf1.get_variable(
                name, shape=value.shape, dtype=tf.as_dtype(value.dtype), initializer=initial,
                partitioner=tf1.fixed_size_partitioner(2) if name in partitioned else None))
        saver = tf1.train.Saver()
        with tf1.Session() as session:
            session.run(tf1.global_variables_initializer())
            saver.save(session, str(out / "model.ckpt"), global_step=int(values["global_step"]),
                       write_meta_graph=False)
    return out


def restored_values(case, implementation, directory: Path):
    """What the target model holds after restoring `directory` and creating its slots: canonical
    variables and slots, and the step."""
    import tensorflow as tf

    from verify.core.names import native_name
    from verify.runners.capture.tf_internals import create_keras_optimizer_state, keras_optimizer_slots

    tf.keras.backend.clear_session()
    runner = implementation.runner
    model = runner.build_model(runner.steps_per_execution)
    status = tf.train.Checkpoint(model=model, optimizer=model.optimizer).restore(
        tf.train.latest_checkpoint(str(directory)))
    variables = {native_name(v): v for v in model.trainable_variables}
    create_keras_optimizer_state(model.optimizer, list(variables.values()))
    status.assert_consumed()   # every value in the checkpoint has its place, and vice versa
    out = {}
    for native, variable in variables.items():
        canonical, transform = implementation.names.canonical_of(native)
        out[canonical] = transform.to_canonical(variable.numpy())
    for key, slot in keras_optimizer_slots(model.optimizer, variables).items():
        native, _, kind = key.partition("::")
        canonical, transform = implementation.names.canonical_of(native)
        out[f"{canonical}/{kind}"] = transform.to_canonical(slot.numpy())
    return out, int(model.optimizer.iterations.numpy())


def tf1_values(case, checkpoint_dir: Path, slot_keys: dict[str, str]):
    """The TF1 checkpoint's values in canonical names: variables through the name map, slots
    through `slot_keys` (canonical slot suffix -> TF1 key suffix)."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(checkpoint_dir)))
    names = case.implementation("tf1").names
    out = {}
    for canonical in names.entries:
        native = names.native(canonical)
        out[canonical] = native.transform.to_canonical(reader.get_tensor(native.native))
        for kind, suffix in slot_keys.items():
            out[f"{canonical}/{kind}"] = native.transform.to_canonical(
                reader.get_tensor(f"{native.native}/{suffix}"))
    return out, int(reader.get_tensor("global_step"))


def nothing_written(dst: Path) -> bool:
    return not dst.exists() and not list(dst.parent.glob(f".{dst.name}.partial-*"))


@pytest.fixture(scope="module")
def tpu_case(tf_devices):
    from cases.tpu_embedding import CASE

    return CASE


@pytest.fixture(scope="module")
def tpu_checkpoint(tpu_case, tmp_path_factory):
    return tf1_checkpoint(tpu_case, tmp_path_factory.mktemp("tpu"))


@pytest.mark.slow
def test_tpu_embedding_checkpoint_carries_every_table_weight_slot_and_the_step(
        tpu_case, tpu_checkpoint, tmp_path):
    from verify.checkpoint import convert_checkpoint

    tf2 = tpu_case.implementation("tf2")
    dst = convert_checkpoint(tpu_case, tpu_case.implementation("tf1"), tf2, tpu_checkpoint,
                             tmp_path / "tf2")
    expected, step = tf1_values(tpu_case, tpu_checkpoint, {"accumulator": "Adagrad"})
    got, iterations = restored_values(tpu_case, tf2, dst)
    assert sorted(got) == sorted(expected) and len(got) == 6
    for name in expected:   # bit for bit: a conversion moves values, it computes nothing
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    assert iterations == step == K
    manifest = json.loads((dst / "conversion.json").read_text())
    assert manifest["step"] == K and manifest["left_at_initial"] == []
    assert sorted(manifest["carried"]) == sorted([*expected, STEP])
    assert not list(tmp_path.glob(".*partial*"))


@pytest.mark.slow
def test_a_slot_missing_from_the_source_checkpoint_is_refused_and_nothing_is_written(
        tpu_case, tpu_checkpoint, tmp_path):
    from verify.checkpoint import convert_checkpoint

    src = rewrite_checkpoint(tpu_checkpoint, tmp_path / "src", drop=("dense/kernel/Adagrad",))
    dst = tmp_path / "out" / "tf2"
    with pytest.raises(ConversionError) as raised:
        convert_checkpoint(tpu_case, tpu_case.implementation("tf1"),
                           tpu_case.implementation("tf2"), src, dst)
    message = str(raised.value)
    assert "missing from the checkpoint (1): dense/kernel/accumulator (dense/kernel/Adagrad)" in message
    assert nothing_written(dst)


@pytest.mark.slow
def test_a_table_that_does_not_map_and_an_unmapped_variable_are_both_listed(
        tpu_case, tpu_checkpoint, tmp_path):
    from verify.checkpoint import convert_checkpoint

    table = "dense_features/sparse_feature_embedding/embedding_weights"
    src = rewrite_checkpoint(tpu_checkpoint, tmp_path / "src", replace={
        table: np.zeros((12, 5), np.float32),
        "other_feature_embedding/embedding_weights": np.zeros((4, 5), np.float32)})
    dst = tmp_path / "tf2"
    with pytest.raises(ConversionError) as raised:
        convert_checkpoint(tpu_case, tpu_case.implementation("tf1"),
                           tpu_case.implementation("tf2"), src, dst)
    message = str(raised.value)
    assert f"{table} (12, 5) where the model_fn builds (10, 5)" in message
    assert "mapped to nothing (1): other_feature_embedding/embedding_weights (4, 5)" in message
    assert nothing_written(dst)


@pytest.mark.slow
def test_existing_destination_and_a_failing_write_leave_nothing_behind(
        tpu_case, tpu_checkpoint, tmp_path, monkeypatch):
    import tensorflow as tf

    from verify.checkpoint import convert_checkpoint

    tf1, tf2 = tpu_case.implementation("tf1"), tpu_case.implementation("tf2")
    existing = tmp_path / "existing"
    existing.mkdir()
    (existing / "keep").write_text("mine")
    with pytest.raises(ConversionError, match="exists; converting writes a new directory"):
        convert_checkpoint(tpu_case, tf1, tf2, tpu_checkpoint, existing)
    assert [p.name for p in existing.iterdir()] == ["keep"]

    def broken_save(self, prefix, options=None):
        Path(prefix + ".index").write_text("half")
        raise OSError("disk full")

    monkeypatch.setattr(tf.train.Checkpoint, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        convert_checkpoint(tpu_case, tf1, tf2, tpu_checkpoint, tmp_path / "tf2")
    assert nothing_written(tmp_path / "tf2")


@pytest.mark.slow
def test_a_pattern_left_at_initial_that_matches_no_slot_is_an_error(
        tpu_case, tpu_checkpoint, tmp_path):
    from verify.checkpoint import convert_checkpoint

    with pytest.raises(ConversionError, match=r"\['embedding/\*/m'\] match no slot"):
        convert_checkpoint(tpu_case, tpu_case.implementation("tf1"),
                           tpu_case.implementation("tf2"), tpu_checkpoint, tmp_path / "tf2",
                           leave_at_initial=("embedding/*/m",))
    assert nothing_written(tmp_path / "tf2")


@pytest.fixture(scope="module")
def adam_case(tf_devices):
    from cases.recommender import make_case

    return make_case("adam")


@pytest.fixture(scope="module")
def adam_checkpoint(adam_case, tmp_path_factory):
    return tf1_checkpoint(adam_case, tmp_path_factory.mktemp("adam"))


@pytest.mark.slow
def test_adam_checkpoint_carries_m_v_and_the_step_that_sets_its_bias_correction(
        adam_case, adam_checkpoint, tmp_path):
    from verify.checkpoint import convert_checkpoint

    tf2 = adam_case.implementation("tf2")
    dst = convert_checkpoint(adam_case, adam_case.implementation("tf1"), tf2, adam_checkpoint,
                             tmp_path / "tf2")
    expected, step = tf1_values(adam_case, adam_checkpoint, {"m": "Adam", "v": "Adam_1"})
    got, iterations = restored_values(adam_case, tf2, dst)
    assert sorted(got) == sorted(expected) and len(got) == 27   # 9 variables, m and v each
    for name in expected:
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)
    assert iterations == step == K


@pytest.mark.slow
def test_a_tpu_written_checkpoint_reads_its_tables_adam_slots_and_partitioned_tables(
        adam_case, adam_checkpoint, tmp_path):
    """TPUEstimator's embedding engine keeps a table's Adam slots as `<table>/Adam/m` and
    `/Adam/v`, each table split over the TPU hosts; synthesized here from a CPU checkpoint
    (no TPU run)."""
    from verify.checkpoint import convert_checkpoint

    table = "candidate_item_item_history_shared_embedding"
    rename = {f"{table}/Adam": f"{table}/Adam/m", f"{table}/Adam_1": f"{table}/Adam/v"}
    src = rewrite_checkpoint(adam_checkpoint, tmp_path / "tpu", rename=rename,
                             partitioned=(table, *rename.values()))
    import tensorflow as tf

    keys = dict(tf.train.list_variables(str(src)))
    assert f"{table}/Adam/m" in keys and f"{table}/Adam" not in keys
    tf2 = adam_case.implementation("tf2")
    dst = convert_checkpoint(adam_case, adam_case.implementation("tf1"), tf2, src,
                             tmp_path / "tf2")
    expected, _ = tf1_values(adam_case, adam_checkpoint, {"m": "Adam", "v": "Adam_1"})
    got, _ = restored_values(adam_case, tf2, dst)
    for name in ("embedding/item", "embedding/item/m", "embedding/item/v"):
        np.testing.assert_array_equal(got[name], expected[name], err_msg=name)


@pytest.mark.slow
def test_adam_beta_powers_that_disagree_with_the_global_step_are_refused(
        adam_case, adam_checkpoint, tmp_path):
    from verify.checkpoint import convert_checkpoint

    src = rewrite_checkpoint(adam_checkpoint, tmp_path / "src",
                             replace={"global_step": np.int64(K + 5)})
    with pytest.raises(ConversionError, match=r"beta1_power is .* but global_step 8 means "
                                              r"0.9\*\*9"):
        convert_checkpoint(adam_case, adam_case.implementation("tf1"),
                           adam_case.implementation("tf2"), src, tmp_path / "tf2")
    assert nothing_written(tmp_path / "tf2")


@pytest.mark.slow
def test_adam_beta_powers_of_a_long_run_drift_in_float32_and_still_match_its_step(
        adam_case, adam_checkpoint, tmp_path):
    """After 10,000 steps TF1's float32 beta2_power is 1.3e-4 away from 0.999**10001."""
    from verify.checkpoint import convert_checkpoint

    step, powers = 10_000, {}
    for name, beta in (("beta1_power", 0.9), ("beta2_power", 0.999)):
        power = np.float32(beta)
        for _ in range(step):   # as TF1's AdamOptimizer updates it, one float32 multiply a step
            power = np.float32(power * np.float32(beta))
        powers[name] = power
    assert abs(powers["beta2_power"] / 0.999 ** (step + 1) - 1) > 1e-4
    src = rewrite_checkpoint(adam_checkpoint, tmp_path / "src",
                             replace={"global_step": np.int64(step), **powers})
    dst = convert_checkpoint(adam_case, adam_case.implementation("tf1"),
                             adam_case.implementation("tf2"), src, tmp_path / "tf2")
    assert json.loads((dst / "conversion.json").read_text())["step"] == step


@pytest.mark.slow
def test_an_optimizer_whose_slots_the_target_lacks_lists_every_slot_on_each_side(
        adam_case, adam_checkpoint, tmp_path):
    from cases.recommender import TF2_NAMES, tf2_keras
    from verify import Implementation, KerasRunner
    from verify.checkpoint import convert_checkpoint

    adagrad = Implementation("tf2-adagrad", KerasRunner(
        build_model=tf2_keras.make_build_model("adagrad"), dataset_fn=tf2_keras.dataset_fn),
        TF2_NAMES)
    dst = tmp_path / "tf2"
    with pytest.raises(ConversionError) as raised:
        convert_checkpoint(adam_case, adam_case.implementation("tf1"), adagrad, adam_checkpoint,
                           dst)
    message = str(raised.value)
    assert "with no place in tf2-adagrad (18)" in message           # m and v of 9 variables
    assert "needed by tf2-adagrad, not in tf1 (9)" in message       # their accumulators
    assert "embedding/item/v <- candidate_item_item_history_shared_embedding/Adam_1" in message
    assert "dense0/kernel/accumulator -> Adagrad slot 'accumulator' of dense0/kernel" in message
    assert "tf1 keeps [m, v], tf2-adagrad keeps [accumulator]" in message
    assert nothing_written(dst)


@pytest.mark.slow
def test_cli_converts_and_exits_2_listing_what_does_not_map(
        tpu_checkpoint, tmp_path, capsys):
    from verify.__main__ import main

    args = ["checkpoint", "convert", "--case", "tpu_embedding", "--from", "tf1", "--to", "tf2"]
    assert main([*args, str(tpu_checkpoint), str(tmp_path / "tf2")]) == 0
    out = capsys.readouterr().out
    assert f"checkpoint: {tmp_path / 'tf2'} (tpu_embedding: tf1 -> tf2, step {K}, 7 values" in out
    assert main([*args[:-1], "tf3", str(tpu_checkpoint), str(tmp_path / "x")]) == 2
    assert "has no implementation 'tf3'" in capsys.readouterr().err
    src = rewrite_checkpoint(tpu_checkpoint, tmp_path / "src", drop=("dense/bias/Adagrad",))
    assert main([*args, str(src), str(tmp_path / "y")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot convert tf1 (TF1 checkpoint ")
    assert "dense/bias/accumulator (dense/bias/Adagrad)" in err
    assert nothing_written(tmp_path / "y")


@pytest.mark.slow
def test_the_pipelines_own_restore_code_is_judged_and_one_that_loses_the_optimizer_fails(
        tpu_case):
    """ResumeRunner(restore=...) runs the implementation's own restore code: faithful, it
    agrees with tf1 resuming from its own checkpoint; losing the optimizer's state, it fails at
    the first update's slots."""
    from verify.runners.run import run_implementation

    case = dataclasses.replace(tpu_case, steps=K)
    traces = {name: run_implementation(case, case.implementation(name))
              for name in ("tf1-resume", "tf2-resume-own-restore",
                           "control-own-restore-recompiled")}
    assert traces["tf2-resume-own-restore"].meta.details["resumed_from"]["restore"] == (
        "cases.tpu_embedding.tf2_keras:restore_training_state")
    specs = {s.candidate: s for s in case.pair_specs()}
    own = judge_pair(specs["tf2-resume-own-restore"], traces.__getitem__, case.tolerances)
    assert own.verdict.ok, own.record.message
    forgot = judge_pair(specs["control-own-restore-recompiled"], traces.__getitem__,
                        case.tolerances)
    assert forgot.record.verdict == "CAUGHT", forgot.record.message
    assert (forgot.verdict.divergence.step, forgot.verdict.divergence.quantity) == (1, "slot")


def test_a_resume_around_a_runner_that_cannot_restore_is_refused_by_name():
    from verify import LoopRunner, ResumeRunner
    from verify.core.case import Implementation
    from verify.core.names import NameMap
    from verify.runners.tf1.estimator import EstimatorRunner

    loop = LoopRunner(build_loop=lambda context: None, epochs=1)
    source = Implementation("ref", loop, NameMap({}))
    with pytest.raises(NotImplementedError, match="LoopRunner cannot resume from a checkpoint"):
        ResumeRunner(source, loop).check_runner()
    estimator = EstimatorRunner(model_fn=None, input_fn=None)
    with pytest.raises(NotImplementedError, match="EstimatorRunner restores its checkpoint"):
        ResumeRunner(source, estimator, restore=lambda m, o, p: None).check_runner()


@pytest.mark.slow
def test_convert_of_a_truncated_checkpoint_or_into_an_unwritable_place_says_so(
        tpu_checkpoint, tmp_path, capsys, monkeypatch):
    import shutil

    from verify.__main__ import main

    monkeypatch.setattr("verify.runners.capture.devices.configure_cpu_replicas", lambda *a: None)
    cut = tmp_path / "cut"
    shutil.copytree(tpu_checkpoint, cut)
    for data in cut.glob("*.data-*"):
        data.write_bytes(data.read_bytes()[: data.stat().st_size // 2])
    argv = ["checkpoint", "convert", "--case", "tpu_embedding", "--from", "tf1", "--to", "tf2"]
    assert main([*argv, str(cut), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "the checkpoint is damaged or cut short" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert main([*argv, str(tpu_checkpoint), str(blocker / "out")]) == 2
    assert f"cannot write {blocker / 'out'}" in capsys.readouterr().err
