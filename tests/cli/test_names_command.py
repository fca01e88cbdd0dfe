"""`python -m verify names`: a case being written, with empty name maps, gets the name map of
each side proposed from its runner's variables (TF1 model_fn, Keras model, custom loop);
a side with a name map shows it, transforms included."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # builds TensorFlow models

ROOT = Path(__file__).resolve().parents[2]

NEW_CASE = '''
import dataclasses

from verify import Case, Implementation, NameMap
from cases.tpu_embedding import CASE as SHIPPED
from cases.custom_loop import QUICK, build_case
from cases.custom_loop.data import synthetic_fashion_mnist

LOOP = build_case(synthetic_fashion_mnist(16, 8, seed=3), dataclasses.replace(
    QUICK, name="tiny", train_examples=16, test_examples=8, batch_per_replica=8))


def blank(case, name):
    """The case's implementation `name` as a user starts it: no name map yet."""
    return dataclasses.replace(case.implementation(name), names=NameMap({}))


CASES = [
    dataclasses.replace(SHIPPED, name="new_embedding",
                        implementations=(blank(SHIPPED, "tf1"), blank(SHIPPED, "tf2")),
                        pairs=(("tf1", "tf2"),)),
    dataclasses.replace(LOOP, name="new_loop", reference="reference-x1",
                        implementations=(blank(LOOP, "reference-x1"),), pairs=(),
                        noise_variants={}, sensitivity=()),
]
'''


def names(tmp_path, *args):
    (tmp_path / "new_cases.py").write_text(textwrap.dedent(NEW_CASE))
    return subprocess.run([sys.executable, "-m", "verify", "names", *args, "--cases",
                           str(tmp_path / "new_cases.py")], cwd=ROOT, capture_output=True,
                          text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_a_new_embedding_case_gets_its_name_maps_proposed(tmp_path):
    done = names(tmp_path, "new_embedding")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert ("dense_features/sparse_feature_embedding/embedding_weights (10, 5) float32 -> "
            "embedding/sparse_feature  [shape (the only one)]") in out
    assert "'embedding/sparse_feature': 'tpu_embedding/table_0'," in out
    # TF2 concatenates [dense, embedding]: the kernel's shape still matches, its row order is
    # what no shape can tell (the comparison's first step shows it: control-concat-order)
    assert "'dense/kernel': 'dense/kernel'," in out


def test_a_loops_same_shaped_biases_are_matched_in_creation_order_and_flagged(tmp_path):
    done = names(tmp_path, "new_loop", "reference-x1")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "# shape and creation order: check it" in done.stdout


def test_an_unknown_implementation_is_bad_input(tmp_path):
    done = names(tmp_path, "new_embedding", "tf3")
    assert done.returncode == 2
    assert "case new_embedding has no implementation 'tf3'" in done.stderr
