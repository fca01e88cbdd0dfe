"""Trace persistence and input digests."""
import numpy as np

from verify.core.case import SparseIds
from verify.core.trace import SparseRows, Trace, digest_batch


def test_save_and_load_round_trip_every_kind_of_value(tmp_path):
    t = Trace("tf2", {"replicas": 2, "tensorflow": "2.15.1"}, error=None)
    t.record(0, "weight", "w", np.arange(4, dtype=np.float32))
    t.record(1, "input", "x", "abc123")
    t.record(1, "loss", "loss", np.float32(0.25))
    t.record(1, "grad", "table", SparseRows(np.array([0, 3]), np.ones((2, 2), np.float32),
                                            (np.int64(5), np.int32(2))))  # as TF hands them over
    t.save(tmp_path / "trace")
    back = Trace.load(tmp_path / "trace")
    assert back.implementation == "tf2" and back.meta == t.meta
    assert set(back.values) == set(t.values)
    assert back.get(1, "input", "x") == "abc123"
    g = back.get(1, "grad", "table")
    assert isinstance(g, SparseRows) and g.dense_shape == (5, 2)
    assert all(type(d) is int for d in g.dense_shape)
    assert np.array_equal(g.to_dense(), t.get(1, "grad", "table").to_dense())
    assert not list(tmp_path.glob(".*"))  # no temporary files left behind


def test_digest_ignores_integer_width_and_sparse_layout_but_not_data():
    ids = SparseIds.from_lists([[1, 2], [3]])
    wider = SparseIds(ids.indices.astype(np.int32), ids.values.astype(np.int32), (2, 5))
    a = digest_batch({"ids": ids, "x": np.ones(2, np.float64)})
    b = digest_batch({"ids": wider, "x": np.ones(2, np.float32)})
    for name in ("ids", "x"):
        assert a[name].digests.tolist() == b[name].digests.tolist()
    reordered = SparseIds.from_lists([[3], [1, 2]])
    assert digest_batch({"ids": reordered})["ids"].digests.tolist() != a["ids"].digests.tolist()


def test_an_input_is_saved_and_read_back_with_its_layout(tmp_path):
    trace = Trace("tf2")
    small = digest_batch({"ids": SparseIds.from_lists([[1, 2], [3]]),
                          "image": np.zeros((2, 200, 100), np.float32)})
    for name, feature in small.items():
        trace.record(1, "input", name, feature)
    back = Trace.load(trace.save(tmp_path / "t"))
    ids, image = back.get(1, "input", "ids"), back.get(1, "input", "image")
    assert ids.layout == "SparseTensor int64 (2, 2)" and ids.values.tolist() == [1, 2, 3]
    assert ids.digests.tolist() == small["ids"].digests.tolist()
    assert image.values is None and image.lengths.tolist() == [20000, 20000]


def test_a_trace_of_a_very_long_name_is_kept_and_read_back(tmp_path):
    """A 300-character implementation name (file systems refuse names over 255 bytes)."""
    from verify.store.kept_traces import keep_trace, load_trace

    name = "tf2-" + "mirrored-" * 33
    trace = Trace(name)
    trace.record(1, "loss", "loss", np.float32(0.5))
    path = keep_trace(tmp_path, "case-" + "x" * 300, trace)
    assert len(path.name) < 255
    assert load_trace(path).implementation == name
