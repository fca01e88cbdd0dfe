"""Resume from another implementation's checkpoint: the "resume" pair kind.

A migration is done when the new pipeline also continues the old one's training: the TF1
model's trained tables, weights and optimizer slots carried into the TF2 model must train on
as TF1 would have. `ResumeRunner` wraps an implementation's own runner so that its run

1. trains `source` (the reference, from the case's initial values) for the run's steps and
   keeps its checkpoint,
2. converts that checkpoint into this implementation's format through both name maps
   (`verify.checkpoint.convert_checkpoint`), unless `runner` is the source's own runner: the
   source then resumes from its checkpoint as written, which is what the TF1 pipeline does,
3. restores it into the model built by the implementation's own code and trains it for the
   same number of steps, observed as usual.

Its trace holds the restored weights at step 0, the evaluation of the restored model at step
0, and steps 1..K after the restore, so the usual per-step comparison judges the pair:
a weight that did not carry over fails at step 0, a slot at step 1.

With `restore=`, step 3 runs the implementation's own restore code instead of the suite's
(`restore(model, optimizer, checkpoint_prefix)`: a `tf.train.Checkpoint` of the user's object
graph, `expect_partial()`, a mapping of their own), so a bug in it is judged like any other:
a restore that loads the model but not the optimizer fails at step 1, where the first update
reads the slots it left at their initial values.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

from verify.core.case import Case, Implementation
from verify.core.runner import Runner, RunRequest, UnsupportedRequest, capabilities
from verify.core.trace import Trace


@dataclasses.dataclass(frozen=True)
class ResumeRunner:
    """Resume `runner` from the checkpoint `source` writes after the run's steps.

    `leave_at_initial` (shell patterns of canonical slot names, e.g. `embedding/*/accumulator`,
    or `verify.checkpoint.STEP`) is for negative controls: those slots are not carried over and
    keep the value the target's optimizer creates them with (the step count stays 0).

    >>> TF1 = Implementation("tf1", EstimatorRunner(...), TF1_NAMES)  # doctest: +SKIP
    >>> Implementation("tf1-resume", ResumeRunner(TF1, TF1.runner), TF1_NAMES)  # doctest: +SKIP
    >>> Implementation("tf2-resume", ResumeRunner(TF1, tf2_runner), TF2_NAMES)  # doctest: +SKIP
    """

    source: Implementation
    runner: Runner
    leave_at_initial: tuple[str, ...] = ()
    # The implementation's own restore code, `restore(model, optimizer, checkpoint_prefix)`
    # (Keras runners), or its "module:function" name (imported when the run starts, so a case
    # names it without importing TensorFlow); None: the suite restores
    # `tf.train.Checkpoint(model=..., optimizer=...)` itself.
    restore: Callable[[Any, Any, str], Any] | str | None = None

    @property
    def wrapped(self) -> Runner:
        """The runner that trains after the restore (what checkpoint conversion writes for)."""
        return self.runner

    @property
    def own_checkpoint(self) -> bool:
        """The source resuming from its own checkpoint, as written (no conversion)."""
        return self.runner is self.source.runner and not self.leave_at_initial

    def describe(self) -> dict[str, Any]:
        out = {"api": "resume from a checkpoint", "source": self.source.name,
               "checkpoint": "its own" if self.own_checkpoint else "converted",
               "runner": self.runner.describe()}
        if self.leave_at_initial:
            out["left_at_initial"] = list(self.leave_at_initial)
        out["restore"] = ("the suite's" if self.restore is None else
                          f"the implementation's own: {_qualified(self.restore)}")
        return out

    def declared_config(self, case: Case, implementation: Implementation) -> dict[str, Any]:
        return self.runner.declared_config(case, implementation)

    def native_variables(self, case: Case, implementation: Implementation) -> dict[str, Any]:
        return self.runner.native_variables(case, implementation)

    def restore_code(self) -> Callable[[Any, Any, str], Any] | None:
        """The implementation's restore function (imported when named by a string)."""
        if not isinstance(self.restore, str):
            return self.restore
        module, sep, name = self.restore.partition(":")
        if not sep:
            raise ValueError(f"ResumeRunner(restore={self.restore!r}): name it as "
                             f"'module:function'")
        return getattr(importlib.import_module(module), name)

    @property
    def capabilities(self) -> frozenset[str]:
        """What a resume pair can be asked (`verify.core.runner.CAPABILITIES`): a TPU when
        both the source and the resuming runner train there, gradient nudges when the resuming
        runner takes them. No sensitivity mutations: their pairs are not
        made for resumed runs."""
        resuming = capabilities(self.runner)
        tpu = {"tpu"} if "tpu" in resuming & capabilities(self.source.runner) else set()
        return frozenset(resuming & {"nudges"} | tpu)

    def check_runner(self) -> None:
        """Refuse a runner that cannot do what this resume asks of it, naming both."""
        kind = type(getattr(self.runner, "resolve", lambda: self.runner)()).__name__
        if "resume" not in capabilities(self.runner):
            raise UnsupportedRequest(
                f"ResumeRunner: {kind} cannot resume from a checkpoint (it declares no 'resume' "
                f"capability, so it would train from the initial values); resume pairs run "
                f"EstimatorRunner and KerasRunner implementations")
        if self.restore is not None and "own_restore" not in capabilities(self.runner):
            raise UnsupportedRequest(
                f"ResumeRunner(restore=...): {kind} restores its checkpoint itself and calls no "
                f"restore code of the implementation's; own restore code runs with KerasRunner")
        if "write_checkpoint" not in capabilities(self.source.runner):
            raise UnsupportedRequest(
                f"ResumeRunner: the source {self.source.name} cannot keep its trained state as "
                f"a checkpoint, so there is nothing to resume from")

    def run(self, request: RunRequest) -> Trace:
        from verify.checkpoint.convert import convert_checkpoint

        # the resume and restore capabilities of both runs (run_implementation checked what
        # the outer request needs: a TPU, nudges)
        self.check_runner()
        case, implementation = request.case, request.implementation
        workdir = request.workdir / "resume"
        source_checkpoint = workdir / f"{self.source.name}-checkpoint"
        source_request = RunRequest(
            case=case, implementation=self.source, steps=request.steps,
            initial_values=self.source.names.to_native(case.initial_values),
            device=request.device, workdir=workdir, capture_steps=False,
            tpu_name=request.tpu_name, checkpoint_dir=source_checkpoint)
        self.source.runner.run(source_request)
        if self.own_checkpoint:
            restore = source_checkpoint
        else:
            restore = workdir / f"{implementation.name}-converted"
            convert_checkpoint(case, self.source,
                               dataclasses.replace(implementation, runner=self.runner),
                               source_checkpoint, restore,
                               leave_at_initial=self.leave_at_initial)
        resumed = dataclasses.replace(request, restore_from=restore,
                                      restore_with=self.restore_code())
        trace = self.runner.run(resumed)
        trace.meta.details["resumed_from"] = {
            "implementation": self.source.name, "steps": request.steps,
            "checkpoint": "its own" if self.own_checkpoint else "converted",
            "left_at_initial": list(self.leave_at_initial),
            "restore": "the suite's" if self.restore is None else _qualified(self.restore)}
        return trace


def _qualified(function) -> str:
    if isinstance(function, str):
        return function
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', function)}"
