"""What a runner declares it can do is checked once, where a run is asked for: a request that
needs more is refused naming the runner and the capability, never silently ignored."""
import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from verify import (EstimatorRunner, Implementation, Keras3Runner, KerasRunner, LoopRunner,
                    MultiWorkerLoopRunner, NameMap, ResumeRunner)
from verify.core.case import Case, Examples, Mutation
from verify.core.runner import (CAPABILITIES, RunRequest, UnsupportedRequest, capabilities,
                                check_capable, needed_capabilities)
from verify.core.trace import Trace


def request(runner, **changes) -> RunRequest:
    side = Implementation("side", runner, NameMap({}), mutation=changes.pop("mutation", None))
    fields = dict(case=None, implementation=side, steps=1, initial_values={}, device="cpu",
                  workdir=Path("."), trace=Trace("side"))
    return RunRequest(**{**fields, **changes})


def test_every_declared_capability_is_one_the_suite_knows():
    import verify

    # every runner the package exports (a new one included), but ResumeRunner, which has
    # the capabilities of the runs it wraps (tested below)
    kinds = [getattr(verify, name) for name in verify.__all__
             if name.endswith("Runner") and name != "ResumeRunner"]
    assert {EstimatorRunner, KerasRunner, Keras3Runner, LoopRunner} <= set(kinds)
    for kind in kinds:
        assert capabilities(kind) <= set(CAPABILITIES), kind
    assert "tpu" in capabilities(KerasRunner) & capabilities(LoopRunner) & \
        capabilities(Keras3Runner)
    assert "tpu" not in capabilities(MultiWorkerLoopRunner)
    # a layer replay observes one process's replicas: not the workers' shares; no TPU path
    assert capabilities(MultiWorkerLoopRunner) == capabilities(LoopRunner) - {"layer_replay",
                                                                              "tpu"}
    assert {"layer_replay"} <= capabilities(EstimatorRunner) & capabilities(KerasRunner) & \
        capabilities(LoopRunner)
    assert capabilities(Keras3Runner) == frozenset({"tpu"})


@pytest.mark.parametrize("kind, changes, says", [
    (MultiWorkerLoopRunner, {"device": "tpu"}, "cannot train on a TPU (--tpu)"),
    (Keras3Runner, {"mutation": Mutation("learning_rate", 1.01)}, "apply a sensitivity mutation"),
    (EstimatorRunner, {"mutation": Mutation("clip_global_norm", 1.0)},
     "apply a sensitivity mutation"),
    (LoopRunner, {"restore_from": Path("ckpt")}, "resume from a checkpoint"),
    (EstimatorRunner, {"restore_with": print}, "run the implementation's own restore code"),
    (Keras3Runner, {"checkpoint_dir": Path("out")}, "keep its trained state as a checkpoint"),
])
def test_a_request_beyond_the_runner_is_refused_naming_both(kind, changes, says):
    runner = kind.__new__(kind)      # the class's declaration is what is checked
    with pytest.raises(UnsupportedRequest, match=f"side runs {kind.__name__}, which cannot"):
        check_capable(runner, request(runner, **changes))
    with pytest.raises(UnsupportedRequest, match=re.escape(says)):
        check_capable(runner, request(runner, **changes))


def test_what_a_runner_declares_passes_and_a_plain_request_needs_nothing():
    keras = KerasRunner.__new__(KerasRunner)
    for changes in ({"device": "tpu"}, {"mutation": Mutation("learning_rate", 1.01)},
                    {"restore_from": Path("c"), "restore_with": print},
                    {"checkpoint_dir": Path("o")}):
        check_capable(keras, request(keras, **changes))       # negative control: no refusal

    class UsersOwn:                                           # declares nothing
        pass

    assert needed_capabilities(request(UsersOwn())) == []
    check_capable(UsersOwn(), request(UsersOwn()))
    assert needed_capabilities(request(UsersOwn(), mutation=Mutation("nudge_gradients"))) == \
        ["nudges"]


def test_a_refused_request_is_a_failing_run_with_the_reason():
    """run_implementation checks before the runner starts: the trace fails with the refusal
    and no step (the run never began)."""
    from verify.runners.run import run_implementation

    class CpuNumpy:
        ran = False

        def run(self, req):
            CpuNumpy.ran = True
            return req.trace

        def describe(self):
            return {}

        def declared_config(self, case, implementation):
            return {}

    side = Implementation("numpy", CpuNumpy(), NameMap({}))
    case = Case("caps", Examples({"x": np.zeros((2, 1))}, labels=np.zeros(2)), 1, 2, {},
                (side,), "numpy")
    trace = run_implementation(case, side, device="tpu")
    assert trace.error.startswith("UnsupportedRequest: numpy runs CpuNumpy, which cannot train "
                                  "on a TPU (--tpu) (its capabilities: none declared)")
    assert not CpuNumpy.ran and trace.steps() == []


def test_a_resume_pair_can_do_what_both_its_runners_can():
    tf1 = Implementation("tf1", EstimatorRunner.__new__(EstimatorRunner), NameMap({}))
    keras = KerasRunner.__new__(KerasRunner)
    resume = ResumeRunner(tf1, keras)
    assert capabilities(resume) == {"tpu", "nudges"}
    loop = ResumeRunner(tf1, LoopRunner.__new__(LoopRunner))
    with pytest.raises(UnsupportedRequest, match="LoopRunner cannot resume from a checkpoint"):
        loop.check_runner()
    resume.check_runner()                                     # negative control
    keras3_source = dataclasses.replace(tf1, runner=Keras3Runner.__new__(Keras3Runner))
    with pytest.raises(UnsupportedRequest, match="cannot keep its trained state"):
        ResumeRunner(keras3_source, keras).check_runner()
