"""The TF1 side: `tf.compat.v1.estimator.tpu.TPUEstimator` with embedding columns."""
