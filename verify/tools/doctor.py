"""`python -m verify doctor [--tpu]`: every mechanism the capture relies on, checked on the
device at hand, one line each with its evidence, and a bundle to attach to a bug report.

The first run on a new device is where the capture's assumptions meet it. Each check runs one
mechanism on known values and compares what comes back:

- `device`: the TPU's resolver and topology (`--tpu`), or the CPU's logical devices;
- `host_transfer`: a value sent to the host from inside a multi-step function under the
  strategy, through the taps' own send (`tf.tpu.outside_compilation` on a TPU), every step
  and replica;
- `host_call`: a TPUEstimator's `host_call` (its outfeed on a TPU) of a known tensor, every
  step;
- `table_readback`: an embedding table and its Adagrad slot loaded into a tfrs `TPUEmbedding`
  model under the strategy and read back through a checkpoint into its CPU twin (on a TPU:
  through the embedding engine, the table sharded over its cores);
- `slot_names`: the slot names each embedding optimizer gives its tables (TPUEstimator's and
  the TPU embedding API's), against the names the suite maps.

Without `--tpu` the checks run with the CPU stand-ins the tests use (the default strategy for
`TPUStrategy`; `outside_compilation` outside a TPU computation calls its function in place):
they show the suite's own code works in this installation, not that a TPU does. With `--tpu`
and no TPU reachable, `device` fails at once saying why and the other checks do not run.

>>> [check.name for check in CHECKS]
['device', 'host_transfer', 'host_call', 'table_readback', 'slot_names']
"""
from __future__ import annotations

import dataclasses
import json
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import numpy as np

from verify.core.files import write_atomic
from verify.core.meta import Environment

STEPS = 3          # steps of the multi-step checks
VOCABULARY = 64    # rows of the read-back table: sharded over the cores of a TPU
DIMENSION = 4


class CheckFailed(AssertionError):
    """A mechanism returned something other than what it was given; the message is the
    evidence."""


@dataclasses.dataclass(frozen=True)
class Setting:
    """Where the checks run: `device` ("cpu" or "tpu"), the TPU's name, a work directory."""

    device: str
    tpu_name: str
    workdir: Path

    def strategy(self):
        """`TPUStrategy` on the TPU, or its CPU stand-in (the default strategy)."""
        import tensorflow as tf

        if self.device == "tpu":
            from verify.runners.capture import tpu

            return tpu.tpu_strategy(self.tpu_name)
        return tf.distribute.get_strategy()


@dataclasses.dataclass(frozen=True)
class Check:
    name: str
    mechanism: str
    run: Callable[[Setting], str]   # returns the evidence, raises CheckFailed


@dataclasses.dataclass(frozen=True)
class CheckResult:
    """One check's line: `status` is "pass", "fail" or "not run"."""

    name: str
    mechanism: str
    status: str
    evidence: str
    seconds: float = 0.0

    def line(self) -> str:
        return f"{self.status.upper():7} {self.name:15} {self.mechanism}: {self.evidence}"


def check_device(setting: Setting) -> str:
    import tensorflow as tf

    if setting.device == "tpu":
        from verify.runners.capture.devices import TpuUnavailable, resolve_tpu

        try:
            resolver = resolve_tpu(setting.tpu_name)
        except TpuUnavailable as e:
            raise CheckFailed(str(e)) from None
        cores = tf.config.list_logical_devices("TPU")
        return (f"{len(cores)} TPU cores ({resolver.master() or 'local'}): "
                f"{', '.join(d.name for d in cores[:8])}" + (" ..." if len(cores) > 8 else ""))
    cpus = tf.config.list_logical_devices("CPU")
    return (f"no --tpu: {len(cpus)} logical CPU device(s); the TPU mechanisms below run with "
            f"their CPU stand-ins")


def check_host_transfer(setting: Setting) -> str:
    """Known values sent from inside one function of STEPS steps under the strategy, through
    `StepTaps._emit` with `host_transfer`, must reach the host once per step and replica."""
    import tensorflow as tf

    from verify.core.trace import Trace
    from verify.runners.capture import tpu
    from verify.runners.capture.taps import StepTaps

    strategy = setting.strategy()
    replicas = strategy.num_replicas_in_sync
    taps = StepTaps(Trace("doctor"), {}, replicas, lambda optimizer: {},
                    host_transfer=tpu.host_transfer)
    received: list[tuple[int, float, float]] = []

    def on_host(replica, values):
        received.append((replica, float(values["step"]), float(values["value"])))

    def step_fn(step):
        value = tf.cast(step, tf.float32) * 0.5 + 1.0
        taps._emit(on_host, {"step": tf.cast(step, tf.float32), "value": value},
                   sequenced=False)
        return value

    @tf.function
    def steps():
        for step in tf.range(STEPS):
            strategy.run(step_fn, args=(step,))

    steps()
    expected = {(r, float(s), s * 0.5 + 1.0) for r in range(replicas) for s in range(STEPS)}
    got = set(received)
    if got != expected or len(received) != len(expected):
        raise CheckFailed(f"sent {len(expected)} values ({STEPS} steps x {replicas} replicas), "
                          f"the host received {len(received)}: missing "
                          f"{sorted(expected - got)[:4]}, unexpected {sorted(got - expected)[:4]}")
    return f"{STEPS} steps x {replicas} replica(s) in one function: every value arrived, equal"


def check_host_call(setting: Setting) -> str:
    """A TPUEstimator's host_call of a known tensor (`1 + step / 2`) over STEPS steps."""
    import tensorflow as tf

    tf1 = tf.compat.v1
    received: list[tuple[int, float]] = []

    def record(steps, values):
        received.extend(zip(np.asarray(steps).ravel().tolist(),
                            np.asarray(values).ravel().tolist()))
        return np.int64(0)

    def host_fn(step, value):
        return [tf.numpy_function(record, [step, value], tf.int64, stateful=True)]

    def model_fn(features, labels, mode, params):
        weight = tf1.get_variable("w", [1], initializer=tf1.zeros_initializer())
        loss = tf.reduce_mean(tf.square(features["x"] * weight - labels))
        step = tf1.train.get_global_step()
        train_op = tf1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
        known = tf.cast(step, tf.float32) * 0.5 + 1.0
        return tf1.estimator.tpu.TPUEstimatorSpec(
            mode, loss=loss, train_op=train_op,
            host_call=(host_fn, [tf.reshape(step, [1]), tf.reshape(known, [1])]))

    def input_fn(params):
        x = np.ones((64, 1), np.float32)
        return tf1.data.Dataset.from_tensor_slices(({"x": x}, x)).repeat().batch(
            params["batch_size"], drop_remainder=True)

    resolver, use_tpu = None, False
    if setting.device == "tpu":
        from verify.runners.capture import tpu

        resolver, use_tpu = tpu.estimator_cluster(setting.tpu_name)
    config = tf1.estimator.tpu.RunConfig(
        cluster=resolver, model_dir=str(setting.workdir / "host_call"),
        save_checkpoints_steps=None, save_checkpoints_secs=None, log_step_count_steps=None,
        tpu_config=tf1.estimator.tpu.TPUConfig(iterations_per_loop=STEPS))
    estimator = tf1.estimator.tpu.TPUEstimator(model_fn=model_fn, config=config,
                                               use_tpu=use_tpu, train_batch_size=8)
    estimator.train(input_fn, steps=STEPS)
    steps = sorted({step for step, _ in received})
    wrong = [(step, value) for step, value in received if value != step * 0.5 + 1.0]
    if len(steps) != STEPS or wrong:
        raise CheckFailed(f"{STEPS} steps trained; host_call received steps {steps} with "
                          f"{len(wrong)} wrong value(s) {wrong[:4]}")
    return f"{STEPS} steps: host_call received every step's known value, equal"


def check_table_readback(setting: Setting) -> str:
    """Known table and accumulator values loaded into a tfrs model under the strategy, then
    read back into its CPU twin through a checkpoint, must come back unchanged."""
    import tensorflow as tf

    from verify.runners.keras.tpu import TwinReadBack, twin_tables

    def build():
        import tensorflow_recommenders as tfrs

        optimizer = tf.keras.optimizers.legacy.Adagrad(0.1)
        ids = tf.keras.Input(shape=(), dtype=tf.int32, batch_size=8)
        embedded = tfrs.layers.embedding.TPUEmbedding(
            feature_config=tf.tpu.experimental.embedding.FeatureConfig(
                table=tf.tpu.experimental.embedding.TableConfig(
                    vocabulary_size=VOCABULARY, dim=DIMENSION, name="doctor_table"),
                name="doctor_feature"),
            optimizer=optimizer)(ids)
        model = tf.keras.Model(ids, tf.keras.layers.Dense(1)(embedded))
        model.compile(optimizer, "mse")
        return model

    tf.keras.backend.clear_session()
    twin = build()
    tables, slots = twin_tables(twin)
    strategy = setting.strategy()
    tf.keras.backend.clear_session()
    with strategy.scope():
        model = build()
    rng = np.random.default_rng(0)
    known = {name: rng.normal(size=tuple(v.shape)).astype(np.float32)
             for name, v in {**tables, **slots}.items()}
    for name, variable in {**tables, **slots}.items():
        variable.assign(known[name])
    readback = TwinReadBack(model, twin, setting.workdir / "readback")
    readback.load()
    for variable in {**tables, **slots}.values():
        variable.assign(tf.zeros_like(variable))
    readback.read()
    differing = [name for name, variable in {**tables, **slots}.items()
                 if not np.array_equal(variable.numpy(), known[name])]
    if not tables or differing:
        raise CheckFailed(f"read back through a checkpoint: {len(tables)} table(s), "
                          f"{len(slots)} slot(s); not equal to what was loaded: {differing}")
    return (f"{VOCABULARY}x{DIMENSION} table and its {len(slots)} slot(s) loaded under "
            f"{type(strategy).__name__}, read back into the CPU twin: equal")


# The slot each embedding optimizer keeps, as the suite's name maps know it: TPUEstimator's
# host variables (-> the TF1 optimizer's slot on CPU) and the TPU embedding API's slots.
EXPECTED_TF1_SLOTS = {"SGD": {}, "Adagrad": {"table/Adagrad": "accumulator"},
                      "Adam": {"table/Adam/m": "m", "table/Adam/v": "v"},
                      "FTRL": {"table/Ftrl": "accum", "table/Ftrl_1": "linear"}}
EXPECTED_ENGINE_SLOTS = {"SGD": [], "Adagrad": ["accumulators"],
                         "Adam": ["momenta", "velocities"], "FTRL": ["accumulators", "linears"]}


def check_slot_names(setting: Setting) -> str:
    import tensorflow as tf

    from verify.runners.capture.tf_internals import tpu_embedding_slot_names

    tf1 = tf.compat.v1
    tf1_parameters = {"SGD": tf1.tpu.experimental.StochasticGradientDescentParameters(0.1),
                      "Adagrad": tf1.tpu.experimental.AdagradParameters(0.1),
                      "Adam": tf1.tpu.experimental.AdamParameters(0.1),
                      "FTRL": tf1.tpu.experimental.FtrlParameters(0.1)}
    engine = {"SGD": tf.tpu.experimental.embedding.SGD(0.1),
              "Adagrad": tf.tpu.experimental.embedding.Adagrad(0.1),
              "Adam": tf.tpu.experimental.embedding.Adam(0.1),
              "FTRL": tf.tpu.experimental.embedding.FTRL(0.1)}
    problems = []
    for name, parameters in tf1_parameters.items():
        got = tpu_embedding_slot_names("scope/table", parameters)
        got = {key.replace("scope/", "", 1): slot for key, slot in got.items()}
        if got != EXPECTED_TF1_SLOTS[name]:
            problems.append(f"TPUEstimator {name}: {got}, expected {EXPECTED_TF1_SLOTS[name]}")
        slots = list(engine[name]._slot_names())
        if slots != EXPECTED_ENGINE_SLOTS[name]:
            problems.append(f"TPU embedding {name}: {slots}, expected "
                            f"{EXPECTED_ENGINE_SLOTS[name]}")
    if problems:
        raise CheckFailed("; ".join(problems))
    return "SGD, Adagrad, Adam, FTRL: TPUEstimator's and the TPU embedding API's slot names " \
           "are the ones the suite maps"


CHECKS = (
    Check("device", "resolver and topology", check_device),
    Check("host_transfer", "a tap's send inside a multi-step function", check_host_transfer),
    Check("host_call", "TPUEstimator host_call of a known tensor", check_host_call),
    Check("table_readback", "a table read back through a checkpoint into the CPU twin",
          check_table_readback),
    Check("slot_names", "slot names of each embedding optimizer", check_slot_names),
)


def run_checks(setting: Setting, checks: tuple[Check, ...] = CHECKS) -> list[CheckResult]:
    """Every check in order; after a failed `device` check the others do not run. Each starts
    from the process's fresh state, as a run does (`starting_fresh`): no check sees what an
    earlier check or run in the process left set."""
    from verify.runners.capture.process_state import starting_fresh

    results = []
    for check in checks:
        if results and results[0].name == "device" and results[0].status == "fail":
            results.append(CheckResult(check.name, check.mechanism, "not run",
                                       "the device check failed"))
            continue
        started = time.perf_counter()
        try:
            starting_fresh()
            status, evidence = "pass", check.run(setting)
        except CheckFailed as e:
            status, evidence = "fail", str(e)
        except Exception as e:  # noqa: BLE001 - a mechanism that raises is a failing check
            status = "fail"
            evidence = f"raised {type(e).__name__}: {_first_line(e)}"
            traceback.print_exc()
        results.append(CheckResult(check.name, check.mechanism, status, evidence,
                                   round(time.perf_counter() - started, 2)))
    return results


def write_bundle(directory: Path, setting: Setting, results: list[CheckResult]) -> Path:
    """`doctor.json` (the checks, the environment, the device) and `doctor.txt` (the lines) in
    `directory`: what to attach to a bug report."""
    directory.mkdir(parents=True, exist_ok=True)
    document: dict[str, Any] = {
        "schema": "parity-doctor/1", "device": setting.device, "tpu_name": setting.tpu_name,
        "stand_ins": setting.device != "tpu",
        "environment": dataclasses.asdict(Environment.current()),
        "checks": [dataclasses.asdict(r) for r in results]}
    write_atomic(directory / "doctor.json", json.dumps(document, indent=1))
    write_atomic(directory / "doctor.txt", "\n".join(r.line() for r in results) + "\n")
    return directory / "doctor.json"


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:500] if text else ""
