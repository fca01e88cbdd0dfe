"""The shipped Adam variants (verify.runners.tf1.adam_variants): a model_fn wrapped by
`with_pow_adam` creates the pow-rounded Adam while it builds, and the class TF1 ships again
after; Keras betas as float32 make `1 - beta_2` TF1's."""
import numpy as np
import pytest


@pytest.mark.slow   # imports TensorFlow
def test_with_pow_adam_swaps_the_class_only_while_the_model_fn_builds():
    import tensorflow as tf

    from verify.runners.tf1.adam_variants import PowAdamOptimizer, keras_betas, with_pow_adam

    shipped = tf.compat.v1.train.AdamOptimizer
    seen = with_pow_adam(lambda features, labels, mode, params:
                         tf.compat.v1.train.AdamOptimizer(0.01))(None, None, "train", {})
    assert type(seen) is PowAdamOptimizer and isinstance(seen, shipped)
    assert tf.compat.v1.train.AdamOptimizer is shipped
    one_minus = np.float32(1.0) - np.float32(keras_betas()["beta_2"])
    assert one_minus == np.float32(1.0) - np.float32(0.999) != np.float32(0.001)
