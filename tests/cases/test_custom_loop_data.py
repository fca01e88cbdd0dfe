"""Fashion-MNIST for the custom-loop case: the IDX reader, where real data is looked for, and
the synthetic stand-in. Only the Keras-cache test imports TensorFlow."""
import gzip

import numpy as np
import pytest

from cases.custom_loop import data as data_module
from cases.custom_loop.data import (FILES, load_fashion_mnist, make_initial_values,
                                    synthetic_fashion_mnist)
from cases.custom_loop.idx import IdxFormatError, read_idx, write_idx


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("name", ["values-idx3", "values-idx3.gz"])
def test_idx_round_trip(tmp_path, dtype, name):
    array = (np.arange(2 * 3 * 4) * 37 - 5).reshape(2, 3, 4).astype(dtype)
    write_idx(tmp_path / name, array)
    back = read_idx(tmp_path / name)
    assert back.dtype == np.dtype(dtype) and back.dtype.isnative
    np.testing.assert_array_equal(back, array)


def test_idx_reader_reads_the_published_layout(tmp_path):
    """Bytes written by hand as the format defines them: magic 0x00000801, count, values."""
    path = tmp_path / "labels-idx1-ubyte.gz"
    with gzip.open(path, "wb") as f:
        f.write(bytes([0, 0, 0x08, 1]) + (3).to_bytes(4, "big") + bytes([9, 0, 4]))
    assert read_idx(path).tolist() == [9, 0, 4]
    path = tmp_path / "shorts-idx2"
    path.write_bytes(bytes([0, 0, 0x0B, 2]) + (1).to_bytes(4, "big") + (2).to_bytes(4, "big")
                     + (258).to_bytes(2, "big") + (-2).to_bytes(2, "big", signed=True))
    assert read_idx(path).tolist() == [[258, -2]]


@pytest.mark.parametrize("payload, message", [
    (bytes([1, 0, 8, 1, 0, 0, 0, 1, 7]), "magic number"),
    (bytes([0, 0, 0x42, 1, 0, 0, 0, 1, 7]), "unknown IDX type code 0x42"),
    (bytes([0, 0, 8, 2, 0, 0, 0, 1]), "header declares 2 dimensions"),
    (bytes([0, 0, 8, 1, 0, 0, 0, 3, 7, 7]), "needs 3 bytes of values, the file has 2"),
    (b"", "empty file"),
])
def test_idx_reader_rejects_malformed_files(tmp_path, payload, message):
    path = tmp_path / "broken-idx"
    path.write_bytes(payload)
    with pytest.raises(IdxFormatError, match=message):
        read_idx(path)


def write_fashion_mnist(directory, train=6, test=4, seed=0):
    """Four tiny IDX files laid out as Fashion-MNIST's."""
    rng = np.random.default_rng(seed)
    arrays = {"train_images": rng.integers(0, 256, (train, 28, 28), dtype=np.uint8),
              "train_labels": rng.integers(0, 10, train, dtype=np.uint8),
              "test_images": rng.integers(0, 256, (test, 28, 28), dtype=np.uint8),
              "test_labels": rng.integers(0, 10, test, dtype=np.uint8)}
    directory.mkdir(parents=True, exist_ok=True)
    for name, array in arrays.items():
        write_idx(directory / FILES[name], array)
    return arrays


@pytest.fixture
def no_keras_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(data_module, "keras_cache_dir", lambda: tmp_path / "no-cache")


def test_data_dir_is_read_with_the_idx_reader(tmp_path, no_keras_cache):
    written = write_fashion_mnist(tmp_path / "fashion-mnist")
    data = load_fashion_mnist(tmp_path)
    assert not data.is_synthetic and str(tmp_path / "fashion-mnist") in data.source
    for name, array in written.items():
        np.testing.assert_array_equal(getattr(data, name), array)


def test_a_partial_data_dir_is_an_error(tmp_path, no_keras_cache):
    write_fashion_mnist(tmp_path)
    (tmp_path / FILES["test_labels"]).unlink()
    with pytest.raises(FileNotFoundError, match="t10k-labels-idx1-ubyte.gz"):
        load_fashion_mnist(tmp_path)


def test_without_real_data_the_synthetic_set_is_used(tmp_path, no_keras_cache):
    data = load_fashion_mnist(tmp_path, synthetic_seed=3, synthetic_counts=(5, 2))
    assert data.is_synthetic and data.source == "synthetic (seed 3)"
    assert data.train_images.shape == (5, 28, 28) and data.test_labels.shape == (2,)


def test_keras_cache_is_read_by_load_data_without_downloading(tmp_path, monkeypatch):
    """With the four files in ~/.keras/datasets/fashion-mnist, load_data() reads them; with no
    network here, a download attempt would fail the test."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".keras").mkdir()
    written = write_fashion_mnist(tmp_path / ".keras" / "datasets" / "fashion-mnist", seed=5)
    data = load_fashion_mnist(None)
    assert data.source.startswith("fashion-mnist (Keras cache")
    np.testing.assert_array_equal(data.train_images, written["train_images"])
    np.testing.assert_array_equal(data.test_labels, written["test_labels"])


def test_synthetic_set_is_deterministic_and_shaped_like_fashion_mnist():
    a = synthetic_fashion_mnist(50, 20, seed=4)
    b = synthetic_fashion_mnist(50, 20, seed=4)
    other = synthetic_fashion_mnist(50, 20, seed=5)
    for name in ("train_images", "train_labels", "test_images", "test_labels"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert not np.array_equal(a.train_images, other.train_images)
    assert a.train_images.dtype == np.uint8 and a.train_images.shape == (50, 28, 28)
    assert a.train_labels.dtype == np.uint8 and set(a.train_labels) <= set(range(10))
    assert not np.array_equal(a.train_images[:20], a.test_images)   # separate draws


def test_synthetic_classes_are_separable():
    """Nearest class mean on raw pixels beats chance by far: the set is learnable."""
    data = synthetic_fashion_mnist(2000, 500, seed=0)
    x, y = data.train_images.reshape(2000, -1).astype(float), data.train_labels
    means = np.stack([x[y == c].mean(0) for c in range(10)])
    test = data.test_images.reshape(500, -1).astype(float)
    predicted = np.argmin(((test[:, None, :] - means[None]) ** 2).sum(-1), axis=1)
    assert (predicted == data.test_labels).mean() > 0.5


def test_head_keeps_the_first_examples_and_says_so():
    data = synthetic_fashion_mnist(10, 6, seed=1).head(4, 3)
    assert data.train_images.shape == (4, 28, 28) and len(data.test_labels) == 3
    assert data.source == "synthetic (seed 1), first 4 train / 3 test examples"


def test_initial_values_follow_keras_defaults():
    values = make_initial_values(0)
    kernel = values["dense1/kernel"]
    limit = np.sqrt(6 / (1600 + 64))
    assert kernel.dtype == np.float32 and np.abs(kernel).max() <= limit
    assert np.abs(kernel).max() > 0.9 * limit
    assert not values["conv1/bias"].any()
    np.testing.assert_array_equal(make_initial_values(0)["conv2/kernel"], values["conv2/kernel"])
