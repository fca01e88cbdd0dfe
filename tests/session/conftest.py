"""One set of trained sides for the layer replay and substitution tests: the shipped cases (the
custom loop on a tiny synthetic set, with two test-only controls of
`tests/session/test_substitution.py`), one trace cache and one store of replayed steps, shared
by the modules so that no pipeline trains or replays twice in a test process."""
import dataclasses
from unittest import mock

import pytest

from verify.core.case import PairSpec, SuiteOptions
from verify.core.tolerances import Tolerances

ACTIVATION_CONTROL = "test-control-dense-elu-x1"
GRADIENT_CONTROL = "test-control-half-relu-gradient-x1"


def _seed_features():
    """The seed model's layers before its hidden Dense (`cases/custom_loop/seed_loop.py`)."""
    import tensorflow as tf

    return [tf.keras.layers.Conv2D(32, 3, activation="relu"), tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Conv2D(64, 3, activation="relu"), tf.keras.layers.MaxPooling2D(),
            tf.keras.layers.Flatten()]


def _elu_model():
    import tensorflow as tf

    return tf.keras.Sequential([*_seed_features(), tf.keras.layers.Dense(64, activation="elu"),
                                tf.keras.layers.Dense(10)])


def _half_gradient_model():
    """The seed's model whose hidden Dense computes relu alike but passes back half of relu's
    gradient (a layer whose backward pass is wrong)."""
    import tensorflow as tf

    class HalfGradientDense(tf.keras.layers.Dense):
        def call(self, inputs):
            @tf.custom_gradient
            def relu(x):
                return tf.nn.relu(x), lambda dy: dy * tf.cast(x > 0, dy.dtype) * 0.5
            return relu(tf.nn.bias_add(tf.matmul(inputs, self.kernel), self.bias))

    return tf.keras.Sequential([*_seed_features(), HalfGradientDense(64, name="dense"),
                                tf.keras.layers.Dense(10, name="dense_1")])


def _with_model(build_loop, make_model):
    from cases.custom_loop import seed_loop

    def build(strategy, context):
        with mock.patch.object(seed_loop, "create_model", make_model):
            return build_loop(strategy, context)
    return build


@dataclasses.dataclass
class ReplaySuite:
    """The shared sides: `replayed(...)` judges a pair and replays it (each side once)."""

    cases: dict
    cache: object
    options: SuiteOptions
    report: object
    captures: dict = dataclasses.field(default_factory=dict)

    def replay(self, mode="diverging", report=True):
        from verify.session.layer_replay import LayerReplay

        replay = LayerReplay(dataclasses.replace(self.options, replay_layers=mode), self.cache,
                             self.report if report else None)
        replay._captures = self.captures   # a side replayed once per process and step
        return replay

    def replayed(self, case_name, reference, candidate, replicas=1, mode="diverging"):
        from verify.judge import judge_pair

        case = self.cases[case_name]
        spec = PairSpec(case.name, reference, candidate, replicas=replicas)
        judged = judge_pair(spec, lambda name: self.cache.trace(case, name),
                            Tolerances.default())
        return self.replay(mode).apply(case, spec, judged)


@pytest.fixture(scope="session")
def replay_suite(tf_devices, tmp_path_factory):
    from tiny_loop import tiny_loop_case
    from verify.runners.case_sources import load_cases, resolve_sources
    from verify.session.trace_supply import TraceSupply

    options = SuiteOptions(steps=1)
    cases = load_cases(resolve_sources(["cases"]), options)
    loop = tiny_loop_case()
    reference = loop.implementation("reference-x1")
    controls = tuple(dataclasses.replace(
        reference, name=name, description=f"test-only: {name}",
        runner=dataclasses.replace(reference.runner, build_loop=_with_model(
            reference.runner.build_loop, model))) for name, model in (
        (ACTIVATION_CONTROL, _elu_model), (GRADIENT_CONTROL, _half_gradient_model)))
    cases["custom_loop"] = dataclasses.replace(
        loop, implementations=tuple(loop.implementations) + controls)
    cache = TraceSupply(options, judged=lambda: [], notes=[])
    return ReplaySuite(cases, cache, options, tmp_path_factory.mktemp("report"))
