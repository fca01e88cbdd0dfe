"""Fashion-MNIST for the custom-loop case: real when it is on disk, synthetic otherwise.

Where the real data is looked for, in order (nothing is ever downloaded):
1. `--data-dir DIR` holding the four IDX files (`train-images-idx3-ubyte.gz`,
   `train-labels-idx1-ubyte.gz`, `t10k-images-idx3-ubyte.gz`, `t10k-labels-idx1-ubyte.gz`),
   directly or under `DIR/fashion-mnist/`; read with `cases.custom_loop.idx.read_idx`.
2. The Keras cache (`~/.keras/datasets/fashion-mnist/`, or `/tmp/.keras/...` when `~/.keras` is
   not writable, as `keras.utils.get_file` chooses): read with
   `tf.keras.datasets.fashion_mnist.load_data()`, called only when all four files are there.
3. Otherwise a deterministic synthetic set of the same shapes and dtypes (uint8 28x28 images,
   uint8 labels 0-9), drawn from ten class prototypes plus noise so that accuracy means
   something. `FashionMnist.source` says which one was used.

>>> data = synthetic_fashion_mnist(train_count=8, test_count=4, seed=0)
>>> data.train_images.shape, data.train_images.dtype, data.test_labels.shape, data.source
((8, 28, 28), dtype('uint8'), (4,), 'synthetic (seed 0)')
"""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from cases.custom_loop.idx import read_idx

FILES = {"train_images": "train-images-idx3-ubyte.gz", "train_labels": "train-labels-idx1-ubyte.gz",
         "test_images": "t10k-images-idx3-ubyte.gz", "test_labels": "t10k-labels-idx1-ubyte.gz"}
IMAGE_SHAPE = (28, 28)
CLASSES = 10


@dataclasses.dataclass(frozen=True)
class FashionMnist:
    """Train and test images (uint8, N x 28 x 28) and labels (uint8, N), and where they came from."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    source: str

    def __post_init__(self):
        for split in ("train", "test"):
            images, labels = getattr(self, f"{split}_images"), getattr(self, f"{split}_labels")
            if images.shape[1:] != IMAGE_SHAPE or len(images) != len(labels):
                raise ValueError(f"{self.source}: {split} images {images.shape} and labels "
                                 f"{labels.shape} are not N x 28 x 28 and N")

    @property
    def is_synthetic(self) -> bool:
        return self.source.startswith("synthetic")

    def head(self, train: int | None, test: int | None) -> "FashionMnist":
        """The first `train` training and `test` test examples (None: all of them)."""
        note = "" if train is None and test is None else (
            f", first {train or len(self.train_labels)} train / "
            f"{test or len(self.test_labels)} test examples")
        return FashionMnist(self.train_images[:train], self.train_labels[:train],
                            self.test_images[:test], self.test_labels[:test], self.source + note)


def read_fashion_mnist_dir(directory: str | os.PathLike, source: str) -> FashionMnist:
    """Read the four IDX files from `directory`."""
    directory = Path(directory)
    arrays = {name: read_idx(directory / file) for name, file in FILES.items()}
    for name, array in arrays.items():
        if array.dtype != np.uint8:
            raise ValueError(f"{directory / FILES[name]}: expected uint8 values, got {array.dtype}")
    return FashionMnist(**arrays, source=source)


def keras_cache_dir() -> Path:
    """Where `tf.keras.datasets.fashion_mnist.load_data()` keeps its files."""
    base = os.path.expanduser(os.path.join("~", ".keras"))
    if not os.access(base, os.W_OK):
        base = os.path.join("/tmp", ".keras")
    return Path(base) / "datasets" / "fashion-mnist"


def _has_all_files(directory: Path) -> bool:
    present = [(directory / f).is_file() for f in FILES.values()]
    if any(present) and not all(present):
        missing = [f for f, p in zip(FILES.values(), present) if not p]
        raise FileNotFoundError(f"{directory} holds part of Fashion-MNIST; missing {missing}")
    return all(present)


def load_fashion_mnist(data_dir: str | os.PathLike | None = None, *, synthetic_seed: int = 0,
                       synthetic_counts: tuple[int, int] = (60000, 10000)) -> FashionMnist:
    """Real Fashion-MNIST from `data_dir` or the Keras cache, else the synthetic set.

    `synthetic_counts` (train, test) limits how much synthetic data is drawn when no real data
    is found (drawing all 70,000 images takes a second and 50 MB).
    """
    if data_dir is not None:
        for candidate in (Path(data_dir), Path(data_dir) / "fashion-mnist"):
            if candidate.is_dir() and _has_all_files(candidate):
                return read_fashion_mnist_dir(candidate, f"fashion-mnist (IDX files in {candidate})")
    cache = keras_cache_dir()
    if cache.is_dir() and _has_all_files(cache):
        import tensorflow as tf

        (train_images, train_labels), (test_images, test_labels) = (
            tf.keras.datasets.fashion_mnist.load_data())
        return FashionMnist(train_images, train_labels, test_images, test_labels,
                            f"fashion-mnist (Keras cache {cache})")
    return synthetic_fashion_mnist(*synthetic_counts, seed=synthetic_seed)


def synthetic_fashion_mnist(train_count: int = 60000, test_count: int = 10000,
                            seed: int = 0) -> FashionMnist:
    """A deterministic stand-in for Fashion-MNIST: same shapes and dtypes, learnable classes.

    Every class shares one smooth 28x28 pattern and adds its own fainter one (7x7 random
    patterns upsampled); an example is its class's image at a random brightness, shifted by up
    to 2 pixels, plus Gaussian pixel noise, clipped to uint8; 5% of the labels are random. So
    the classes overlap and the loss stays away from zero, as on the real set. The same
    arguments give the same bytes.
    """
    rng = np.random.default_rng([seed, 2])
    shared = rng.uniform(0, 150, (7, 7))
    prototypes = np.kron(shared + rng.uniform(-70, 70, (CLASSES, 7, 7)), np.ones((4, 4)))

    def draw(count: int, stream: int) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng([seed, stream])
        labels = rng.integers(0, CLASSES, count).astype(np.uint8)
        brightness = rng.uniform(0.6, 1.0, (count, 1, 1))
        images = prototypes[labels] * brightness
        shifts = rng.integers(-2, 3, (count, 2))
        for dy, dx in {tuple(s) for s in shifts.tolist()}:
            chosen = (shifts[:, 0] == dy) & (shifts[:, 1] == dx)
            images[chosen] = np.roll(images[chosen], (dy, dx), axis=(1, 2))
        images += rng.normal(0.0, 60.0, images.shape)
        relabelled = rng.uniform(size=count) < 0.05
        labels[relabelled] = rng.integers(0, CLASSES, int(relabelled.sum()))
        return np.clip(np.rint(images), 0, 255).astype(np.uint8), labels

    train_images, train_labels = draw(train_count, 0)
    test_images, test_labels = draw(test_count, 1)
    return FashionMnist(train_images, train_labels, test_images, test_labels,
                        f"synthetic (seed {seed})")


def glorot_uniform(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Keras' default kernel initializer: U(-l, l), l = sqrt(6 / (fan_in + fan_out))."""
    receptive = int(np.prod(shape[:-2])) if len(shape) > 2 else 1
    fan_in, fan_out = shape[-2] * receptive, shape[-1] * receptive
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, shape).astype(np.float32)


# The seed's CNN: canonical name -> shape. Biases start at zero, as Keras' do.
VARIABLE_SHAPES = {
    "conv1/kernel": (3, 3, 1, 32), "conv1/bias": (32,),
    "conv2/kernel": (3, 3, 32, 64), "conv2/bias": (64,),
    "dense1/kernel": (1600, 64), "dense1/bias": (64,),
    "dense2/kernel": (64, 10), "dense2/bias": (10,),
}


def make_initial_values(seed: int) -> dict[str, np.ndarray]:
    """Canonical initial values drawn like Keras' defaults (Glorot-uniform kernels, zero biases)."""
    rng = np.random.default_rng(seed)
    return {name: (glorot_uniform(rng, shape) if name.endswith("kernel")
                   else np.zeros(shape, np.float32))
            for name, shape in VARIABLE_SHAPES.items()}
