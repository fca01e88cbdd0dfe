"""Large trace values kept on disk: written when recorded, read back memory-mapped; traces
saved and loaded one array at a time; memory that does not grow with steps, while recording,
saving, loading and comparing."""
import gc
import hashlib
import json
import os
import threading
import tracemalloc
import zipfile

import numpy as np
import pytest

from verify.core.files import BadFile
from verify.core.tolerances import Tolerances
from verify.core.trace import Key, SparseRows, TouchedRows, Trace
from verify.core import trace_values
from verify.core.trace_values import SpillWriter, TraceValues, spill_bytes_default
from verify.judge.compare import compare_traces

MB = 1 << 20
ROWS, WIDTH = 32_768, 64              # an 8 MiB float32 table


def table(seed: int, rows: int = ROWS) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, WIDTH), dtype=np.float32)


def test_small_values_stay_in_memory_and_large_ones_go_to_disk_as_they_are_recorded():
    values = TraceValues(spill_bytes=MB)
    values["small"] = np.ones(10, np.float32)
    values["large"] = table(0)
    values["sparse"] = SparseRows(np.arange(8192), table(1, 8192), (ROWS, WIDTH))
    values["text"] = "digest"
    assert values.on_disk() == 2
    large = values["large"]
    np.testing.assert_array_equal(large, table(0))
    assert not large.flags.writeable and not large.flags.owndata   # mapped, read-only
    sparse = values["sparse"]
    assert isinstance(sparse, SparseRows) and sparse.dense_shape == (ROWS, WIDTH)
    np.testing.assert_array_equal(sparse.rows, table(1, 8192))
    with pytest.raises(ValueError, match="read-only"):
        large[0, 0] = 1.0
    assert values.nbytes("large") >= ROWS * WIDTH * 4


def test_replaced_and_deleted_values_free_their_files_and_the_directory_goes_with_them():
    values = TraceValues(spill_bytes=MB)
    values["a"] = table(0)
    directory = values._dir
    values.flush()
    assert len(list(directory.iterdir())) == 1
    values["a"] = table(1)                         # replaced: the old file is removed
    values.flush()
    assert len(list(directory.iterdir())) == 1
    np.testing.assert_array_equal(values["a"], table(1))
    del values["a"]
    assert not list(directory.iterdir())
    values["b"] = table(2)
    del values
    gc.collect()
    assert not directory.exists()


def test_the_threshold_and_place_come_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("PARITY_SPILL_BYTES", "0")
    monkeypatch.setenv("PARITY_SPILL_DIR", str(tmp_path / "spill"))
    values = TraceValues()
    values["x"] = np.ones(3, np.float32)
    assert values.on_disk() == 1 and values._dir.parent == tmp_path / "spill"
    monkeypatch.setenv("PARITY_SPILL_BYTES", "a lot")
    with pytest.raises(ValueError, match="PARITY_SPILL_BYTES must be a number of bytes, "
                                         "got 'a lot'"):
        spill_bytes_default()


def test_recording_many_steps_of_a_large_table_holds_what_waits_to_be_written(
        monkeypatch):
    size = ROWS * WIDTH * 4
    monkeypatch.setattr(trace_values, "_WRITER", (os.getpid(), SpillWriter(limit=size)))
    trace = Trace("tf1")
    tracemalloc.start()
    for step in range(12):
        trace.record(step, "weight", "user", table(step))
    trace.values.flush()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert trace.values.on_disk() == 12
    assert current < 0.5 * size, current / size      # nothing of the 12 tables stays
    # the table being made, the one recorded and one waiting to be written (the write-ahead)
    assert peak < 3.5 * size, peak / size
    np.testing.assert_array_equal(trace.get(7, "weight", "user"), table(7))


@pytest.mark.parametrize("compress", [False, True])
def test_saved_and_loaded_one_array_at_a_time_with_every_kind_of_value(tmp_path, compress,
                                                                      monkeypatch):
    monkeypatch.setenv("PARITY_SPILL_BYTES", str(4 * MB))    # the default, whatever is set
    trace = Trace("tf2")
    trace.record(0, "weight", "user", table(0))
    trace.record(1, "grad", "user", SparseRows(np.array([5, 1, 5]), table(1, 3), (ROWS, WIDTH)))
    trace.record(1, "weight", "user",
                 TouchedRows(np.arange(16_384), table(2, 16_384), (ROWS, WIDTH)))
    trace.record(1, "loss", "loss", np.float32(0.5))
    trace.record(1, "input", "ids", "abc123")
    path = trace.save(tmp_path / "t", compress=compress)
    tracemalloc.start()
    loaded = Trace.load(path)
    current = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    if not compress:   # the large arrays are mapped from the npz, not read
        assert current < 0.5 * ROWS * WIDTH * 4
    assert loaded.values.on_disk() == 2
    for key in trace.values:
        expected, got = trace.values[key], loaded.values[key]
        assert type(got) is type(expected)
        if isinstance(expected, (SparseRows, TouchedRows)):
            np.testing.assert_array_equal(got.ids, expected.ids)
            np.testing.assert_array_equal(got.rows, expected.rows)
            assert got.dense_shape == expected.dense_shape
        else:
            np.testing.assert_array_equal(got, expected)


def test_a_loaded_trace_reads_its_arrays_even_after_its_files_are_removed(tmp_path):
    trace = Trace("tf2")
    trace.record(0, "weight", "user", table(3))
    path = trace.save(tmp_path / "t", compress=False)
    loaded = Trace.load(path)
    for f in tmp_path.iterdir():     # what a worker pool does once it has loaded its answer
        f.unlink()
    np.testing.assert_array_equal(loaded.get(0, "weight", "user"), table(3))


def test_a_member_whose_header_promises_more_than_it_holds_is_a_bad_file(tmp_path):
    trace = Trace("tf2")
    trace.record(0, "weight", "user", table(4))
    path = trace.save(tmp_path / "t", compress=False)
    npz = path.with_suffix(".npz")
    with zipfile.ZipFile(npz) as zf:
        info = zf.infolist()[0]
        data = zf.read(info)
    header = data[:data.index(b"}") + 1].decode("latin1")
    bigger = header.replace(f"({ROWS}, {WIDTH})", f"({ROWS * 2}, {WIDTH})")
    forged = bigger.encode("latin1") + data[len(header):]
    with zipfile.ZipFile(npz, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(info.filename, forged)
    saved = json.loads(path.read_text())
    saved["npz_sha256"] = hashlib.sha256(npz.read_bytes()).hexdigest()
    path.write_text(json.dumps(saved))
    with pytest.raises(BadFile, match="promises more data than it holds"):
        Trace.load(path)


def test_comparing_traces_on_disk_holds_a_few_tables_whatever_the_steps(tmp_path):
    """Two sides, 10 steps of an 8 MiB table each, saved uncompressed (as workers hand them
    over) and loaded: the comparison's traced peak stays within 3x one table (it is far less:
    the values are mapped, and the compiled kernel allocates nothing per element)."""
    sides = []
    for name in ("tf1", "tf2"):
        trace = Trace(name)
        for step in range(11):
            trace.record(step, "weight", "user", table(step))
            trace.record(step, "loss", "loss", np.float32(step))
        sides.append(Trace.load(trace.save(tmp_path / name, compress=False)))
        del trace
    gc.collect()
    compare_traces(*sides, Tolerances.default())   # the kernel compiled for read-only arrays
    tracemalloc.start()
    rows = compare_traces(*sides, Tolerances.default())
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert rows["passed"].all() and len(rows) == 22
    assert peak < 3 * ROWS * WIDTH * 4, peak / (ROWS * WIDTH * 4)


def test_a_value_that_cannot_be_written_says_where_and_what_to_do(monkeypatch, tmp_path):
    values = TraceValues(spill_bytes=MB)

    def disk_full(path, array, allow_pickle):
        with open(path, "wb") as f:
            f.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "save", disk_full)
    values["user"] = table(0)            # written on the writer thread: the failure comes
    reason = (r"a trace value of 8 MiB could not be kept on disk in "   # with the next use
              r".*No space left on device.*PARITY_SPILL_DIR")
    with pytest.raises(OSError, match=reason):
        values.flush()
    assert not list(values._dir.iterdir())   # nothing half-written
    with pytest.raises(OSError, match=reason):
        values["user"]
    with pytest.raises(OSError, match=reason):   # a run goes no further than its next record
        values["item"] = np.ones(3, np.float32)
    monkeypatch.setenv("PARITY_SPILL_DIR", str(tmp_path / "a_file"))
    (tmp_path / "a_file").write_text("not a directory")
    with pytest.raises(OSError, match=r"no scratch directory for trace values under .*a_file "
                                      r".*point PARITY_SPILL_DIR at a writable disk"):
        TraceValues(spill_bytes=MB)["user"] = table(0)


def test_a_run_that_fills_the_disk_fails_its_pair_with_the_reason(monkeypatch):
    from verify.core.case import Case, Examples, Implementation
    from verify.core.names import NameMap
    from verify.runners.run import run_implementation

    class WritesTables:
        def run(self, request):
            for step in range(3):
                request.trace.record(step, "weight", "w", table(step))
            return request.trace

        def describe(self):
            return {"runner": "tables"}

        def declared_config(self, case, implementation):
            return {}

    def disk_full(path, array, allow_pickle):
        raise OSError(28, "No space left on device")

    side = Implementation("tables", WritesTables(), NameMap({"w": "w"}))
    case = Case("disk", Examples({"x": np.zeros((2, 1))}, labels=np.zeros(2)), 1, 3,
                {"w": table(0)}, (side,), "tables")
    monkeypatch.setenv("PARITY_SPILL_BYTES", str(MB))
    monkeypatch.setattr(np, "save", disk_full)
    trace = run_implementation(case, side)             # a failing trace, never an exception
    assert trace.error.startswith("OSError: a trace value of 8 MiB could not be kept on disk")
    assert "PARITY_SPILL_DIR" in trace.error


def test_canonical_names_share_the_values_kept_on_disk_instead_of_writing_them_again():
    from verify.core.case import Implementation
    from verify.core.names import Mapped, NameMap, PermuteRows
    from verify.runners.run import canonicalize

    impl = Implementation("tf2", None, NameMap({"user": "emb/user_table",
                                                "k": Mapped("dense/kernel", PermuteRows((1, 0)))}))
    native = Trace("tf2", values=TraceValues(spill_bytes=MB))
    native.record(0, "weight", "emb/user_table", table(0))
    native.record(0, "weight", "dense/kernel", table(1, 2))
    out = canonicalize(native, impl)
    shared = out.values._items[Key(0, "weight", "user")]          # not written again:
    assert not shared.owned and shared.parts[0].path.parent == native.values._dir
    np.testing.assert_array_equal(out.get(0, "weight", "user"), table(0))
    np.testing.assert_array_equal(out.get(0, "weight", "k"), table(1, 2)[::-1])   # transformed
    directory = native.values._dir
    del native
    gc.collect()
    assert directory.exists()                       # kept while the canonical trace needs it
    np.testing.assert_array_equal(out.get(0, "weight", "user"), table(0))
    del out
    gc.collect()
    assert not directory.exists()


def held_disk(monkeypatch, writer: SpillWriter) -> threading.Event:
    """`writer` as the process's writer, on a disk that writes nothing until the event
    returned is set."""
    monkeypatch.setattr(trace_values, "_WRITER", (os.getpid(), writer))
    release, real_save = threading.Event(), np.save

    def slow_disk(path, array, allow_pickle):
        release.wait(30)
        real_save(path, array, allow_pickle=allow_pickle)

    monkeypatch.setattr(np, "save", slow_disk)
    return release


def test_a_run_goes_on_while_its_tables_are_written_and_waits_beyond_the_write_ahead(
        monkeypatch):
    size = ROWS * WIDTH * 4
    writer = SpillWriter(limit=2 * size)
    release = held_disk(monkeypatch, writer)
    values = TraceValues(spill_bytes=MB)
    values["a"], values["b"] = table(0), table(1)     # two tables fit the write-ahead
    assert writer.waiting == 2 * size and not list(values._dir.iterdir())
    read = values["a"]                               # not written yet: the array recorded
    np.testing.assert_array_equal(read, table(0))
    assert not read.flags.writeable
    third = threading.Thread(target=values.__setitem__, args=("c", table(2)))
    third.start()
    third.join(0.5)
    assert third.is_alive(), "a record beyond the write-ahead must wait for room"
    release.set()
    third.join(30)
    values.flush()
    assert writer.waiting == 0 and len(list(values._dir.iterdir())) == 3
    for name, seed in (("a", 0), ("b", 1), ("c", 2)):
        got = values[name]
        np.testing.assert_array_equal(got, table(seed))
        assert isinstance(got.base, np.memmap)   # mapped from its file now


def test_a_replaced_value_and_a_dropped_mapping_wait_for_their_writes(monkeypatch):
    release = held_disk(monkeypatch, SpillWriter())
    values = TraceValues(spill_bytes=MB)
    values["a"] = table(0)
    directory = values._dir
    threading.Timer(0.3, release.set).start()
    values["a"] = table(1)          # the first file is removed once written, never left over
    values.flush()
    assert len(list(directory.iterdir())) == 1
    np.testing.assert_array_equal(values["a"], table(1))
    release.clear()
    values["b"] = table(2)
    threading.Timer(0.3, release.set).start()
    del values                      # its directory goes once the write under way is done
    gc.collect()
    assert not directory.exists()


def test_a_forked_process_gets_a_writer_of_its_own(monkeypatch):
    parent = SpillWriter()
    monkeypatch.setattr(trace_values, "_WRITER", (os.getpid() + 1, parent))   # as after fork
    assert trace_values.spill_writer() is not parent
    assert trace_values.spill_writer() is trace_values.spill_writer()


def test_a_full_disk_inside_a_tensorflow_step_is_said_first_however_long_the_message():
    """A tap inside a tf.function writes through numpy_function; TensorFlow wraps its OSError
    in an UnknownError whose message quotes the node's definition stack (thousands of characters
    in a Keras fit). The cause leads the run's error and the cut keeps the end, not only the
    start."""
    from verify.runners.run import MAX_ERROR, describe_error

    stack = "\n".join(f'  File "keras/engine/training.py", line {i}, in fit' for i in range(200))
    cause = ("OSError: [Errno 28] a trace value of 8 MiB could not be kept on disk in /spill: "
             "No space left on device; point PARITY_SPILL_DIR at a disk with room")
    message = (f"Graph execution error:\n\nDetected at node PyFunc defined at (most recent call "
               f"last):\n{stack}\n\nTraceback (most recent call last):\n\n  File \"taps.py\", "
               f"line 9, in record\n\n{cause}\n\n\t [[{{{{node PyFunc}}}}]]")

    class UnknownError(Exception):
        pass

    text = describe_error(UnknownError(message), step=3)
    assert len(message) > MAX_ERROR and len(text) <= MAX_ERROR
    assert text.startswith(f"UnknownError: {cause} (raised in a Python function TensorFlow "
                           f"called: Graph execution error:)"), text[:300]
    assert "node PyFunc" in text                  # the end of the message is kept
    assert "characters cut" in text
    # negative control: an error that quotes no traceback keeps its own first line
    plain = describe_error(UnknownError("Graph execution error:\nsomething else"), step=3)
    assert plain.startswith("UnknownError: Graph execution error: (step 3)")

