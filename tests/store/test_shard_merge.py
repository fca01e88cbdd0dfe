"""`--shard K/N` and `python -m verify report merge`: shards partition the pairs stably; the
merged report of three shards is the unsharded run's (same verdicts, byte-identical drift.csv);
shards that cannot be one run are refused, and a missing shard makes the run INCOMPLETE."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from synthetic_results import shard_dirs, synthetic_results
from toy_training import CASES, PYTHONPATH
from verify.__main__ import main
from verify.core.pair_spec import shard_of
from verify.store.history import run_record
from verify.render import write_report


@pytest.fixture(autouse=True)
def no_plots(monkeypatch):
    """The report page's plots are not what a merge is judged by (drawing them was 2 s a
    pair; the subprocess run below still draws them)."""
    monkeypatch.setattr("verify.render.plots.PairPlotter.pair_png", lambda self, *a: b"")


def test_shards_partition_the_pairs_stably():
    ids = [f"case_{n % 5}:tf1-vs-candidate-{n}" for n in range(300)]
    shards = [shard_of(i, 4) for i in ids]
    assert set(shards) == {1, 2, 3, 4} and [shard_of(i, 4) for i in ids] == shards
    assert all(100 > shards.count(k) > 50 for k in (1, 2, 3, 4))   # about a quarter each


def test_merged_shards_are_the_whole_run(tmp_path, capsys):
    results, directories = shard_dirs(tmp_path)
    repro = directories[1] / "repro" / "case" / "tf1--tf2"   # a shard's pair found local
    repro.mkdir(parents=True)
    for name in ("repro.py", "values.npz", "repro.json"):
        (repro / name).write_text(name)
    write_report(tmp_path / "whole", results, run_record(results, run_id="w"))
    status = main(["report", "merge", *map(str, directories), "--out", str(tmp_path / "out")])
    assert status == 1   # two pairs fail, as in the whole run
    out = tmp_path / "out"
    assert (out / "drift.csv.gz").read_bytes() == (tmp_path / "whole" / "drift.csv.gz").read_bytes()
    assert (out / "losses.csv").read_bytes() == (tmp_path / "whole" / "losses.csv").read_bytes()
    record = json.loads((out / "run.json").read_text())
    assert record["verdict"] == "FAIL" and record["counts"] == {"PASS": 3, "FAIL": 1}
    assert sorted(record["provenance"]["merged_shards"]) == ["1/3", "2/3", "3/3"]
    assert "shard" not in record["options"]
    assert list((out / "history").glob("*.json"))   # the history record of the merged run
    assert "FAIL" in (out / "summary.md").read_text().splitlines()[0]
    assert (out / "repro" / "case" / "tf1--tf2" / "repro.py").read_text() == "repro.py"


def test_a_missing_shard_makes_the_merged_run_incomplete(tmp_path, capsys):
    _, directories = shard_dirs(tmp_path)
    assert main(["report", "merge", str(directories[0]), str(directories[2]),
                 "--out", str(tmp_path / "out")]) == 1
    record = json.loads((tmp_path / "out" / "run.json").read_text())
    assert record["verdict"] == "INCOMPLETE"
    assert record["not_run"] == {
        "shard 2/3": "not merged: no report directory of shard 2/3 was given"}


@pytest.mark.parametrize("problem, says", [
    ("commit", "the shards differ in provenance git_commit"),
    ("options", "the shards differ in options"),
    ("count", "different shard counts"),
    ("twice", "shard 1 is given twice"),
    ("unsharded", "is not a shard"),
])
def test_shards_that_cannot_be_one_run_are_refused(tmp_path, capsys, problem, says):
    _, directories = shard_dirs(tmp_path / "a")
    if problem == "commit":
        directories[1] = shard_dirs(tmp_path / "b", commit="def")[1][1]
    elif problem == "options":
        directories[1] = shard_dirs(tmp_path / "b", options={"device": "tpu"})[1][1]
    elif problem == "count":
        directories[1] = shard_dirs(tmp_path / "b", count=4)[1][1]
    elif problem == "twice":
        directories[1] = directories[0]
    else:
        results = synthetic_results(pairs=1)
        write_report(tmp_path / "plain", results, run_record(results, run_id="p"))
        directories[1] = tmp_path / "plain"
    assert main(["report", "merge", *map(str, directories), "--out",
                 str(tmp_path / "out")]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_three_shard_runs_merge_into_the_unsharded_run(tmp_path):
    """Each shard of the parity suite (`pytest --shard K/3`) into its own directory, then
    `report merge`: verdicts and drift.csv as the unsharded run's."""
    (tmp_path / "cases").mkdir()
    (tmp_path / "cases" / "__init__.py").write_text(textwrap.dedent(CASES))
    (tmp_path / "conftest.py").write_text(
        "import verify.runners.capture.devices\n"
        "verify.runners.capture.devices.configure_cpu_replicas = lambda count=8: count\n")
    (tmp_path / "test_tiny.py").write_text(
        "from verify.test_parity import pytest_generate_tests, test_pair  # noqa: F401\n")
    environment = {**os.environ, "PYTHONPATH": PYTHONPATH}

    def suite(report, *args):
        return subprocess.run([sys.executable, "-m", "pytest", "test_tiny.py", "-p",
                               "verify.session.plugin", "-p", "no:cacheprovider", "-q",
                               "--report-dir", report, *args], cwd=tmp_path, env=environment,
                              capture_output=True, text=True, timeout=300)

    whole = suite("whole")
    assert whole.returncode == 1, whole.stdout[-2000:]
    for k in (1, 2, 3):
        done = suite(f"shard{k}", "--shard", f"{k}/3")
        assert done.returncode in (0, 1), done.stdout[-2000:]
    merged = subprocess.run([sys.executable, "-m", "verify", "report", "merge", "shard1",
                             "shard2", "shard3", "--out", "merged"], cwd=tmp_path,
                            env=environment, capture_output=True, text=True, timeout=300)
    assert merged.returncode == 1, merged.stderr[-2000:]

    def verdicts(directory):
        record = json.loads((tmp_path / directory / "run.json").read_text())
        return sorted((p["candidate"], p["verdict"]) for p in record["pairs"])

    assert verdicts("merged") == verdicts("whole") == [
        ("a", "PASS"), ("b", "PASS"), ("c", "FAIL"), ("close", "PASS"), ("d", "FAIL")]
    assert all(len(verdicts(f"shard{k}")) < 5 for k in (1, 2, 3))
    assert (tmp_path / "merged" / "drift.csv.gz").read_bytes() == \
        (tmp_path / "whole" / "drift.csv.gz").read_bytes()
