"""`verify`'s public names are imported on first use: `import verify`, and a command that needs
no TensorFlow (`python -m verify report DIR`), load no runner and no TensorFlow."""
import subprocess
import sys
from pathlib import Path

import pytest
from synthetic_results import synthetic_results

import verify
from verify.render import write_report
from verify.store.history import run_record

ROOT = Path(__file__).resolve().parents[2]
# what only running an implementation needs
RUNNING = ("verify.runners", "verify.environments", "verify.checkpoint", "tensorflow", "keras",
           "tf_keras", "tensorflow_recommenders")


def imported(command: list[str]) -> tuple[set[str], subprocess.CompletedProcess]:
    """The modules `python -X importtime <command>` imports, and how it ended."""
    done = subprocess.run([sys.executable, "-X", "importtime", *command], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    names = {line.rsplit("|", 1)[1].strip() for line in done.stderr.splitlines()
             if line.startswith("import time:") and line.count("|") == 2}
    assert "verify" in names, done.stderr[-2000:]
    return names, done


def running_modules(names: set[str]) -> list[str]:
    return sorted(n for n in names if n.split(".")[0] in RUNNING or n.startswith(RUNNING))


def test_report_imports_no_runner_and_no_tensorflow(tmp_path):
    results = synthetic_results(pairs=1, tensors=2, steps=2, failing=1, cases=1)
    write_report(tmp_path / "run", results, run_record(results, run_id="r1"))
    names, done = imported(["-m", "verify", "report", str(tmp_path / "run"),
                            "--out", str(tmp_path / "again")])
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]   # a pair fails
    assert (tmp_path / "again" / "summary.md").is_file()
    assert {"verify.store.results", "verify.render.html", "verify.judge"} <= names
    assert running_modules(names) == []


def test_import_verify_loads_a_name_only_when_it_is_used():
    code = ("import sys, verify\n"
            "print(sorted(m for m in sys.modules if m.startswith('verify')))\n"
            "from verify import Case, Tolerance\n"
            "print('verify.runners' in sys.modules, 'verify.judge' in sys.modules)\n"
            "verify.KerasRunner\n"
            "print('verify.runners.keras.runner' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.stdout.splitlines() == ["['verify']", "False False", "True"], done.stderr[-2000:]


def test_every_public_name_resolves_and_an_unknown_one_is_an_attribute_error():
    assert "KerasRunner" in dir(verify)
    for name in verify.__all__:
        assert getattr(verify, name).__name__ == name
    with pytest.raises(AttributeError, match="no attribute 'KerasRuner'"):
        verify.KerasRuner
    namespace = {}
    exec("from verify import *", namespace)
    assert {"Case", "LoopRunner", "judge_pair"} <= set(namespace)
