"""Convert a trained checkpoint of one implementation of a case into another's format.

`convert_checkpoint` reads the source checkpoint in canonical names through the source
implementation's name map (`verify.checkpoint.tf1_checkpoint`), builds the target model and
lists what it holds (`verify.checkpoint.keras_checkpoint`), checks that every name and shape
maps both ways (`verify.checkpoint.mapping.check_fit`: one error listing all that does not),
and only then writes. The destination directory appears complete or not at all: everything
is written into a hidden directory beside it, renamed into place at the end, and removed when
anything fails.

Supported: a TF1 checkpoint (`EstimatorRunner`: Estimator / TPUEstimator, CPU- or TPU-trained)
into a Keras model (`KerasRunner`, tfrs `TPUEmbedding` included).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
from pathlib import Path

from verify.checkpoint.keras_checkpoint import keras_target, write_keras_checkpoint
from verify.checkpoint.mapping import ConversionError, check_fit
from verify.checkpoint.tf1_checkpoint import read_tf1_checkpoint
from verify.core.case import Case, Implementation
from verify.core.runner import capabilities

MANIFEST = "conversion.json"


def convert_checkpoint(case: Case, source: Implementation, target: Implementation,
                       src: str | Path, dst: str | Path, *,
                       leave_at_initial: tuple[str, ...] = ()) -> Path:
    """Convert the checkpoint `src` (a model_dir or a checkpoint prefix) that `source` trained
    into directory `dst` in `target`'s format; return `dst`. `dst` holds the checkpoint
    (`ckpt-1.*` and its `checkpoint` file, so `tf.train.latest_checkpoint(dst)` finds it) and
    `conversion.json` (what was carried from where). `leave_at_initial` (shell patterns of
    canonical slot names) is for negative controls only: those slots are not carried.

    A `ConversionError` lists every name that does not map on each side; nothing is written.

    >>> from cases.tpu_embedding import CASE as case  # doctest: +SKIP
    >>> convert_checkpoint(case, case.implementation("tf1"), case.implementation("tf2"),
    ...                    "tf1_model_dir", "tf2_checkpoint")  # doctest: +SKIP
    """
    dst = Path(dst)
    if dst.exists():
        raise ConversionError(f"{dst} exists; converting writes a new directory and never "
                              f"overwrites: remove it or choose another")
    source_runner, target_runner = _reader(source), _writer(target)
    source_side, state = read_tf1_checkpoint(case, dataclasses.replace(source,
                                                                       runner=source_runner), src)
    built = keras_target(case, target, target_runner)
    check_fit(source_side, built.side)
    dst.parent.mkdir(parents=True, exist_ok=True)
    partial = dst.parent / f".{dst.name}.partial-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    try:
        written = write_keras_checkpoint(built, state, partial, leave_at_initial=leave_at_initial)
        manifest = {"case": case.name, "source": source.name, "target": target.name,
                    "source_checkpoint": state.source, "step": state.step, **written}
        (partial / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
        os.rename(partial, dst)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return dst


def _inner(runner):
    """The runner a wrapping runner (a `ResumeRunner`: its `wrapped`) trains with, else the
    runner itself; a lazily named runner (`verify.runners.lazy`) built."""
    from verify.runners.lazy import LazyRunner

    runner = getattr(runner, "wrapped", runner)
    return runner.resolve() if isinstance(runner, LazyRunner) else runner


def _reader(implementation: Implementation):
    runner = _inner(implementation.runner)
    if "tf1_checkpoint_source" not in capabilities(runner):
        raise ConversionError(
            f"the source {implementation.name} runs {type(runner).__name__}; checkpoints are "
            f"read from implementations trained by EstimatorRunner (TF1 checkpoints) only")
    return runner


def _writer(implementation: Implementation):
    runner = _inner(implementation.runner)
    if "keras_checkpoint_target" not in capabilities(runner):
        raise ConversionError(
            f"the target {implementation.name} runs {type(runner).__name__}; checkpoints are "
            f"written for implementations trained by KerasRunner (TF2 Keras models) only")
    return runner
