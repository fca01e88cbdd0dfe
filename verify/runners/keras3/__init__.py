"""Keras 3 (and keras-rs) on TensorFlow or JAX, in an environment of its own."""
