"""^C while a `--shard` session writes its final report: the report is written whole, the run
ends with one line and a non-zero status, no traceback. The signal is sent from inside the
report's writing (a stub around `ParitySession.write_report`), so its timing is exact."""
import json
import os
import signal
import subprocess
import sys

import pytest

from toy_training import CASES, PYTHONPATH, write_toy_project

CONFTEST = '''
import os
import signal

import verify.runners.capture.devices
from verify.session.parity_session import ParitySession

verify.runners.capture.devices.configure_cpu_replicas = lambda count=8: count
_write = ParitySession.write_report


def write_report(self, final=True):
    if final:
        os.kill(os.getpid(), signal.SIGINT)   # ^C as the final report is being written
    return _write(self, final)


ParitySession.write_report = write_report
'''


# a pytest session in a subprocess; nothing in it imports TensorFlow
def test_sigint_while_the_final_report_is_written_ends_with_one_line(tmp_path):
    write_toy_project(tmp_path, CASES, CONFTEST)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "test_tiny.py", "-p", "verify.session.plugin", "-p",
         "no:cacheprovider", "-q", "--report-dir", "shard1", "--shard", "1/2"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": PYTHONPATH}, capture_output=True,
        text=True, timeout=300,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # (background jobs
    output = done.stdout + done.stderr                                      # ignore SIGINT)
    assert done.returncode != 0 and "Traceback" not in output, output[-3000:]
    assert "arrived while the final report was written" in output, output[-3000:]
    record = json.loads((tmp_path / "shard1" / "run.json").read_text())
    assert record["verdict"] in ("PASS", "FAIL", "NO RESULTS", "INCOMPLETE")
    assert record["options"]["shard"] == "1/2"
