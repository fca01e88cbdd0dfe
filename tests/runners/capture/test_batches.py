"""A batch as the taps flatten it and the host joins it: sparse and ragged ids of the same
examples reach the canonical input form equal, across replicas too."""
import numpy as np

from verify.core.inputs import input_batch
from verify.runners.capture.batches import flatten_batch, global_batch, unflatten_batch


def host_side(tf_batch):
    return unflatten_batch({k: v.numpy() for k, v in flatten_batch(tf_batch).items()})


def test_ragged_and_sparse_ids_of_two_replicas_join_into_the_same_examples():
    import tensorflow as tf

    lists = [[[4, 2], [], [7]], [[1, 3, 5], [6]]]
    ragged = [({"ids": tf.ragged.constant(part, dtype=tf.int32)}, tf.ones(len(part)))
              for part in lists]
    sparse = [({"ids": tf.sparse.from_dense(tf.ragged.constant(part, dtype=tf.int64)
                                            .to_tensor(default_value=-1))},
               tf.ones((len(part), 1)))
              for part in lists]
    # from_dense keeps every non-zero entry: drop the -1 padding as a pipeline would
    sparse = [({"ids": tf.sparse.retain(f["ids"], f["ids"].values >= 0)}, label)
              for f, label in sparse]
    a = input_batch(global_batch({r: host_side(b) for r, b in enumerate(ragged)}))
    b = input_batch(global_batch({r: host_side(b) for r, b in enumerate(sparse)}))
    assert a["ids"].values.tolist() == [4, 2, 7, 1, 3, 5, 6]
    assert a["ids"].lengths.tolist() == [2, 0, 1, 3, 1]
    for name in ("ids", "label"):
        assert np.array_equal(a[name].digests, b[name].digests), name
    assert a["ids"].layout == "RaggedTensor int32 (5, None)"
    assert b["ids"].layout == "SparseTensor int64 (5, 3)"


def test_a_ragged_tensor_with_a_dense_inner_dimension_is_flattened_per_example():
    import tensorflow as tf

    value = tf.RaggedTensor.from_row_lengths(tf.reshape(tf.range(6), (3, 2)), [2, 0, 1])
    feature = input_batch(host_side(({"x": value}, tf.zeros(3))))["x"]
    assert feature.lengths.tolist() == [4, 0, 2]
    assert feature.values.tolist() == [0, 1, 2, 3, 4, 5]
