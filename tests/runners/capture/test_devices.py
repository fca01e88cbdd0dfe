"""--tpu without a reachable TPU fails loudly, saying why; it never passes or skips."""
import subprocess
import sys
from pathlib import Path
import pytest

pytestmark = pytest.mark.slow   # runs the suite with TensorFlow in a subprocess

ROOT = Path(__file__).resolve().parents[3]


def test_tpu_option_without_a_tpu_fails_every_pair_with_the_reason(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "verify/", "--tpu", "-q", "-p", "no:cacheprovider",
         "-p", "no:benchmark", "--report-dir", str(tmp_path), "--case", "tpu_embedding",
         "-k", "tf1-vs-tf2 and not spe10 and not mirrored and not learning_rate "
               "and not clip_global_norm and not drop_step and not tf221 and not resume"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1, result.stdout[-2000:]
    assert "1 failed" in result.stdout
    assert "no TPU is reachable" in result.stdout
    assert "passed" not in result.stdout.splitlines()[-1]
    assert "no TPU is reachable" in (tmp_path / "summary.md").read_text()


def test_tpu_refuses_several_processes(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "verify/", "--tpu", "-n", "2", "-p", "no:benchmark",
         "--report-dir", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "--tpu runs in one process" in result.stderr + result.stdout


def test_tpu_option_without_a_tpu_fails_every_pair_of_a_case_with_the_reason(tmp_path):
    """Faithful pairs, controls (preflight-only ones too) and mutants: each FAILs, and each
    says what the resolver said; nothing trains."""
    import pandas as pd

    result = subprocess.run(
        [sys.executable, "-m", "pytest", "verify/", "--tpu", "-q", "-p", "no:cacheprovider",
         "-p", "no:benchmark", "--report-dir", str(tmp_path), "--case", "tpu_embedding"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 1, result.stdout[-2000:]
    summary = pd.read_csv(tmp_path / "summary.csv")
    assert len(summary) >= 17 and set(summary["role"]) == {"faithful", "control", "mutant"}
    assert (summary["verdict"] == "FAIL").all()
    assert summary["message"].str.contains("no TPU is reachable").all()
    assert summary["message"].str.contains("TPUClusterResolver").all()
    assert f"{len(summary)} failed" in result.stdout.splitlines()[-1]
