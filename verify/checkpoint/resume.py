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
"""
from __future__ import annotations

import dataclasses
from typing import Any

from verify.core.case import Case, Implementation
from verify.runners.protocol import Runner, RunRequest
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
        return out

    def declared_config(self, case: Case, implementation: Implementation) -> dict[str, Any]:
        return self.runner.declared_config(case, implementation)

    def run(self, request: RunRequest) -> Trace:
        from verify.checkpoint.convert import convert_checkpoint

        case, implementation = request.case, request.implementation
        workdir = request.workdir / "resume"
        source_checkpoint = workdir / f"{self.source.name}-checkpoint"
        self.source.runner.run(RunRequest(
            case=case, implementation=self.source, steps=request.steps,
            initial_values=self.source.names.to_native(case.initial_values),
            device=request.device, workdir=workdir, capture_steps=False,
            tpu_name=request.tpu_name, checkpoint_dir=source_checkpoint))
        if self.own_checkpoint:
            restore = source_checkpoint
        else:
            restore = workdir / f"{implementation.name}-converted"
            convert_checkpoint(case, self.source,
                               dataclasses.replace(implementation, runner=self.runner),
                               source_checkpoint, restore,
                               leave_at_initial=self.leave_at_initial)
        trace = self.runner.run(dataclasses.replace(request, restore_from=restore))
        trace.meta.details["resumed_from"] = {
            "implementation": self.source.name, "steps": request.steps,
            "checkpoint": "its own" if self.own_checkpoint else "converted",
            "left_at_initial": list(self.leave_at_initial)}
        return trace
