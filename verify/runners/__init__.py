"""Running an implementation for real and capturing it: one package per pipeline kind.

- `tf1`: the TF1 TPUEstimator (`EstimatorRunner`).
- `keras`: legacy Keras `compile`/`fit` (`KerasRunner`), its TPU path and evaluation.
- `keras3`: Keras 3 on TensorFlow or JAX (`Keras3Runner`).
- `loop`: custom training loops (`LoopRunner`), on several worker processes
  (`MultiWorkerLoopRunner`) with their cluster and worker entry point.
- `capture`: what every kind shares to observe a run (taps, table capture, mutations, declared
  configuration, devices, process state, TensorFlow internals, host_call and TPU transfers).
- `run`: the entry point (`run_implementation`), `lazy`: runners named by module,
  `worker_group`: the processes of a multi-worker run, started and stopped together,
  `case_sources`: where cases come from (loaded within a time limit) and running what a
  `RunSpec` names.

A kind imports `capture`, `run` and `verify.core`, never another kind (checked by the
import contracts in pyproject.toml, which must list every kind's package:
tests/project/test_import_contracts.py fails while one is missing).
"""
