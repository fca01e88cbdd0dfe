"""Carry a trained checkpoint from one implementation of a case into another, and prove it.

- `convert_checkpoint(case, source, target, src, dst)`: a TF1 (TPU)Estimator checkpoint into
  the TF2 Keras model's `tf.train.Checkpoint`, through the case's name maps: tables, dense
  variables, optimizer slots and the step count; one `ConversionError` listing every name
  that does not map on either side, and nothing written (`python -m verify checkpoint
  convert`).
- `ResumeRunner`: the "resume" pair kind: the reference trains, saves, the checkpoint is
  converted and restored into the candidate, and both train on, compared step by step.
"""
from verify.checkpoint.convert import convert_checkpoint
from verify.checkpoint.mapping import STEP, CanonicalState, ConversionError, Entry, Side, check_fit
from verify.checkpoint.resume import ResumeRunner

__all__ = ["STEP", "CanonicalState", "ConversionError", "Entry", "ResumeRunner", "Side",
           "check_fit", "convert_checkpoint"]
