"""Legacy Keras (`tf.keras` / tf_keras) `compile`/`fit`, with tfrs TPU embeddings: the runner,
its TPU path and the evaluation it records."""
