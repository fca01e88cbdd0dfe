"""The commands after the session (init, calibrate, report merge, --save-golden, doctor,
report --out) held to its standard: bad input is refused before any work (exit 2) with a
message saying what is wrong; an exception of the user's code is the user's error (exit 2,
naming the entry point and the user's frames); nothing the suite did not write is replaced;
^C ends with one line. Everything here runs in-process, with stubs for the measurements: no
TensorFlow is trained."""
import fcntl
import json
import os
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest

from synthetic_results import shard_dirs
from verify.__main__ import main
from verify.core.noise_floor import Calibration, NoiseFloor

CASE_MODULE = '''
import numpy as np
from pathlib import Path

from verify.core.case import Case, Examples, Implementation
from verify.core.names import NameMap


def cases(options):
    return [Case(name={name!r}, examples=Examples({{"x": np.zeros((4, 1))}}, labels=np.zeros(4)),
                 batch_size=2, steps=4, initial_values={{"w": np.zeros(2, np.float32)}},
                 implementations=(Implementation("ref", None, NameMap({{"w": "w"}})),),
                 reference="ref",
                 calibration_file=Path(__file__).with_name("calibration.json"))]
'''


@pytest.fixture
def calibrate(tmp_path, monkeypatch):
    """`calibrate` of a one-reference case, its measurement stubbed; returns (run, measured):
    run(*args) -> exit status, `measured` counts the measurements started."""
    name = f"case_{abs(hash(str(tmp_path))) % 10**8}"
    package = tmp_path / "cases" / name
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(CASE_MODULE.format(name=name))
    measured = []

    def calibrate_case(case, references=None, steps=None, plains=None, device="cpu",
                       tpu_name=""):
        if steps is not None and steps < 1:
            raise AssertionError(f"measured {steps} steps")
        measured.append(case.name)
        floor = NoiseFloor({("loss", "loss"): (0.0, 1e-7)})
        return Calibration(case.name, case.data_digest(), steps or case.steps, {"ref": floor})

    import verify.tools.calibration

    real = verify.tools.calibration.calibrate_case
    monkeypatch.setattr("verify.tools.calibration.calibrate_case", calibrate_case)
    monkeypatch.setattr("verify.runners.capture.devices.configure_cpu_replicas", lambda *a: None)

    def run(*args):
        return main(["calibrate", name, "--cases", str(tmp_path / "cases"), *args])

    run.name, run.package, run.real_calibrate_case = name, package, real
    return run, measured


@pytest.fixture(autouse=True)
def no_plots(monkeypatch):
    """The report page's plots are not what these tests judge: drawing them was 2 s a pair."""
    monkeypatch.setattr("verify.render.plots.PairPlotter.pair_png", lambda self, *a: b"")


@pytest.fixture(scope="module")
def written_shards(tmp_path_factory):
    """Three shards of a synthetic run (one failing pair), written once for the module."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("verify.render.plots.PairPlotter.pair_png", lambda self, *a: b"")
        return shard_dirs(tmp_path_factory.mktemp("shards"))[1]


@pytest.fixture
def shards(written_shards, tmp_path):
    """A copy of the three shard directories, for a test to damage."""
    copies = []
    for directory in written_shards:
        shutil.copytree(directory, tmp_path / directory.name)
        copies.append(tmp_path / directory.name)
    return copies


def _with_option(directory: Path, option: str, value: str) -> Path:
    record = json.loads((directory / "run.json").read_text())
    record["options"][option] = value
    (directory / "run.json").write_text(json.dumps(record))
    return directory


# ---- 1. a merge judged from each shard's own evidence -------------------------------------------

def test_a_shard_whose_summary_is_cut_to_its_header_is_refused(tmp_path, shards, capsys):
    directories = shards
    failing = next(d for d in directories
                   if json.loads((d / "run.json").read_text())["verdict"] == "FAIL")
    summary = failing / "summary.csv"
    summary.write_text(summary.read_text().splitlines()[0] + "\n")   # a truncated upload
    status = main(["report", "merge", *map(str, directories), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert status == 2, err
    assert str(failing) in err and "summary.csv" in err and "run.json" in err
    assert not (tmp_path / "out").exists()


def test_a_shard_whose_drift_rows_fail_a_pair_its_summary_passes_is_refused(tmp_path, shards,
                                                                            capsys):
    directories = shards
    failing = next(d for d in directories
                   if json.loads((d / "run.json").read_text())["verdict"] == "FAIL")
    for name in ("summary.csv", "run.json"):    # both edited to PASS; drift.csv.gz still fails
        path = failing / name
        path.write_text(path.read_text().replace("FAIL", "PASS"))
    status = main(["report", "merge", *map(str, directories), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert status == 2, err
    assert str(failing) in err and "drift.csv.gz" in err


@pytest.mark.parametrize("option, values", [
    ("case_sources", ("cases_a", "cases_b")), ("keyword", ("not replay", "")),
    ("markexpr", ("", "not slow")), ("environments", ("local", "local,tf215")),
    ("golden", ("", "goldens/"))])
def test_shards_that_selected_pairs_differently_are_refused(tmp_path, shards, capsys, option,
                                                            values):
    for n, directory in enumerate(shards):
        _with_option(directory, option, values[n == 1])
    status = main(["report", "merge", *map(str, shards), "--out", str(tmp_path / "out")])
    assert status == 2 and option in capsys.readouterr().err
    if option != "keyword":
        return
    for directory in shards:   # the same shards, alike again, merge
        _with_option(directory, option, values[0])
    assert main(["report", "merge", *map(str, shards), "--out", str(tmp_path / "out")]) == 1


def test_the_run_record_keeps_everything_that_selects_pairs():
    from verify.session.plugin_options import selection_options

    given = {"case_sources": ["cases_a", "more"], "keyword": "not replay", "markexpr": "slow",
             "parity_envs": ["local,tf215"], "golden": "goldens"}

    class Config:
        def getoption(self, name, default=None):
            return given.get(name, default)

    assert selection_options(Config()) == {
        "case_sources": "cases_a,more", "keyword": "not replay", "markexpr": "slow",
        "environments": "local,tf215", "golden": "goldens"}


# ---- 2. goldens replace only a directory the suite wrote ---------------------------------------

def test_save_golden_never_replaces_a_directory_it_did_not_write(tmp_path):
    from verify.store.golden import GOLDEN_MARKER, publish_goldens

    staged = tmp_path / "staged" / "my_case"
    staged.mkdir(parents=True)
    (staged / GOLDEN_MARKER).touch()
    (staged / "case.json").write_text("{}")
    users = tmp_path / "cases" / "my_case"   # --save-golden pointed at the cases folder
    users.mkdir(parents=True)
    (users / "__init__.py").write_text("CASE = ...\n")
    (users / "notes.md").write_text("mine\n")
    skipped: list[str] = []
    published = publish_goldens(tmp_path / "staged", tmp_path / "cases", skipped)
    assert published == [] and (users / "notes.md").read_text() == "mine\n"
    assert sorted(p.name for p in users.iterdir()) == ["__init__.py", "notes.md"]
    assert "my_case" in skipped[0] and "not a golden" in skipped[0]
    # a golden it wrote is replaced whole
    (tmp_path / "goldens").mkdir()
    publish_goldens(tmp_path / "staged", tmp_path / "goldens")
    (tmp_path / "goldens" / "my_case" / "stale.json").write_text("{}")
    assert publish_goldens(tmp_path / "staged", tmp_path / "goldens") == [
        tmp_path / "goldens" / "my_case"]
    assert not (tmp_path / "goldens" / "my_case" / "stale.json").exists()


# ---- 3. the user's exceptions are the user's errors; arguments checked before any work ---------

def _init(tmp_path, monkeypatch, module_text, *args, examples="examples"):
    module = f"pipeline_{abs(hash((str(tmp_path), module_text))) % 10**8}"
    (tmp_path / f"{module}.py").write_text(module_text)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("verify.runners.capture.devices.configure_cpu_replicas", lambda *a: None)
    return main(["init", "my_case", "--tf1", f"{module}:model_fn", f"{module}:input_fn",
                 "--keras", f"{module}:build", f"{module}:data",
                 "--examples", f"{module}:{examples}", "--out", str(tmp_path / "out"), *args])


PIPELINE = ("def model_fn(): pass\ndef input_fn(): pass\ndef build(): pass\n"
            "def data(): pass\n")


def test_init_names_the_users_examples_function_that_raised(tmp_path, monkeypatch, capsys):
    status = _init(tmp_path, monkeypatch, PIPELINE + "def examples():\n    return 1 / 0\n")
    err = capsys.readouterr().err
    assert status == 2, err
    assert "--examples" in err and "ZeroDivisionError" in err and "return 1 / 0" in err
    assert "internal error" not in err and not (tmp_path / "out" / "my_case").exists()


@pytest.mark.parametrize("module_text, says", [
    ("def model_fn(:\n", "SyntaxError"),
    ("raise ImportError('no module named secret_pipeline')\n", "ImportError"),
    (PIPELINE + "examples = 3\n", "not callable")])
def test_init_names_a_broken_user_module_as_the_users_error(tmp_path, monkeypatch, capsys,
                                                            module_text, says):
    status = _init(tmp_path, monkeypatch, module_text)
    err = capsys.readouterr().err
    assert status == 2 and says in err and "internal error" not in err, err


def test_init_refuses_an_entry_point_without_a_colon(tmp_path, monkeypatch, capsys):
    status = main(["init", "my_case", "--tf1", "m:model_fn", "m:input_fn", "--keras", "m:b",
                   "m:d", "--examples", "pipeline.examples", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert status == 2 and "module:function" in err and "unpack" not in err


@pytest.mark.parametrize("steps", ["-2", "0"])
def test_calibrate_refuses_steps_below_one_before_measuring(calibrate, capsys, steps):
    run, measured = calibrate
    assert run("--steps", steps) == 2 and measured == []
    assert "--steps" in capsys.readouterr().err


def test_calibrate_refuses_to_write_a_calibration_of_no_reference(calibrate, monkeypatch,
                                                                  tmp_path, capsys):
    run, _ = calibrate
    monkeypatch.setattr("verify.tools.calibration.calibrate_case", lambda case, **kw: Calibration(
        case.name, case.data_digest(), 4, {}))
    assert run("--out", str(tmp_path / "c.json")) == 2
    assert "no reference was calibrated" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


def test_calibrate_names_a_reference_that_raised_as_the_users_error(calibrate, monkeypatch,
                                                                      capsys):
    from verify.core.trace import Trace

    run, _ = calibrate
    monkeypatch.setattr("verify.tools.calibration.calibrate_case", run.real_calibrate_case)
    monkeypatch.setattr("verify.runners.run.run_implementation", lambda case, imp, **kw: Trace(
        imp.name, {}, error="ValueError: the user's model_fn failed"))
    status = run("--references", "ref")
    err = capsys.readouterr().err
    assert status == 2 and "model_fn failed" in err and "internal error" not in err, err


# ---- 4. output paths checked before any work ----------------------------------------------------

@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "a_file"
    path.write_text("the user's\n")
    return path


@pytest.mark.parametrize("where", ["under_a_file", "a_directory"])
def test_calibrate_checks_its_output_before_measuring(calibrate, a_file, capsys, where):
    run, measured = calibrate
    out = a_file / "calibration.json" if where == "under_a_file" else a_file.parent
    assert run("--out", str(out)) == 2 and measured == []
    assert "--out" in capsys.readouterr().err


def test_doctor_checks_its_output_before_running_checks(a_file, monkeypatch, capsys):
    ran = []
    monkeypatch.setattr("verify.tools.doctor.run_checks", lambda *a: ran.append(1) or [])
    assert main(["doctor", "--out", str(a_file / "doctor")]) == 2 and ran == []
    assert "--out" in capsys.readouterr().err


def test_init_checks_its_output_before_building(tmp_path, a_file, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(tmp_path))
    status = main(["init", "my_case", "--tf1", "m:model_fn", "m:input_fn", "--keras", "m:b",
                   "m:d", "--examples", "m:e", "--out", str(a_file / "cases")])
    assert status == 2 and "--out" in capsys.readouterr().err


@pytest.mark.parametrize("merge", [False, True])
def test_report_checks_its_output_before_writing(shards, a_file, capsys, merge):
    directories = shards
    args = ["merge", *map(str, directories)] if merge else [str(directories[0])]
    assert main(["report", *args, "--out", str(a_file / "report")]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "internal error" not in err
    assert a_file.read_text() == "the user's\n"


# ---- 5. no silent overwrite, no lost write ------------------------------------------------------

def test_calibrate_does_not_replace_a_file_it_did_not_write(calibrate, a_file, capsys):
    run, measured = calibrate
    assert run("--out", str(a_file)) == 2 and measured == []
    assert "--force" in capsys.readouterr().err and a_file.read_text() == "the user's\n"
    assert run("--out", str(a_file), "--force") == 0
    assert Calibration.load(a_file).case == run.name


def test_calibrate_does_not_replace_another_cases_calibration(calibrate, tmp_path, capsys):
    run, measured = calibrate
    other = tmp_path / "other.json"
    Calibration("another_case", "d", 4, {"ref": NoiseFloor({("loss", "loss"): (0.0,)})}).save(
        other)
    assert run("--out", str(other)) == 2 and measured == []
    assert "another_case" in capsys.readouterr().err
    assert Calibration.load(other).case == "another_case"
    assert run("--out", str(tmp_path / "mine.json")) == 0
    assert run("--out", str(tmp_path / "mine.json")) == 0   # its own: replaced


def test_calibrate_merge_holds_a_lock_while_it_reads_and_writes(calibrate, tmp_path,
                                                               monkeypatch):
    run, _ = calibrate
    out = tmp_path / "calibration.json"
    assert run("--out", str(out)) == 0
    held = []
    save = Calibration.save

    def checked_save(self, path):
        lock = Path(str(path) + ".lock")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            held.append(False)
        except BlockingIOError:
            held.append(True)
        finally:
            os.close(fd)
        return save(self, path)

    monkeypatch.setattr(Calibration, "save", checked_save)
    assert run("--out", str(out), "--merge") == 0
    assert held == [True]


def test_report_out_respects_a_running_sessions_lock(tmp_path, shards, capsys):
    from verify.store.report_dir import ReportLock

    directories = shards
    busy = tmp_path / "busy"
    lock = ReportLock(busy)
    lock.acquire("running-session")
    try:
        assert main(["report", str(directories[0]), "--out", str(busy)]) == 2
        assert "running-session" in capsys.readouterr().err
        assert not (busy / "summary.md").exists()
    finally:
        lock.release()


@pytest.mark.parametrize("merge", [False, True])
def test_report_out_does_not_overwrite_a_users_own_file(tmp_path, shards, capsys, merge):
    directories = shards
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "summary.md").write_text("my notes\n")
    args = ["merge", *map(str, directories)] if merge else [str(directories[0])]
    assert main(["report", *args, "--out", str(mine)]) == 2
    assert "summary.md" in capsys.readouterr().err
    assert (mine / "summary.md").read_text() == "my notes\n"
    # a report directory the suite wrote is replaced as the session replaces it
    assert main(["report", *args, "--out", str(tmp_path / "again")]) in (0, 1)
    assert main(["report", *args, "--out", str(tmp_path / "again")]) in (0, 1)


# ---- 6. nonsense refused ------------------------------------------------------------------------

@pytest.mark.parametrize("args, says", [(["--steps", "0"], "--steps"),
                                        (["--batch-size", "0"], "--batch-size")])
def test_init_refuses_what_cannot_run(tmp_path, monkeypatch, capsys, args, says):
    status = _init(tmp_path, monkeypatch, PIPELINE + "def examples(): pass\n", *args)
    assert status == 2 and says in capsys.readouterr().err


def test_init_refuses_no_examples(tmp_path, monkeypatch, capsys):
    module = PIPELINE + ("import numpy as np\nfrom verify import Examples\n"
                         "def examples():\n    return Examples({'x': np.zeros((0, 2))}, "
                         "labels=np.zeros(0))\n")
    status = _init(tmp_path, monkeypatch, module)
    assert status == 2 and "0 examples" in capsys.readouterr().err


@pytest.mark.parametrize("series, says", [([0.0, float("nan")], "NaN"), ([0.0, -1e-7], "negative"),
                                          ([], "no floor"), ([0.0, None], "no floor")])
def test_a_calibration_with_a_nan_negative_or_missing_floor_is_refused(series, says):
    doc = json.loads(Calibration("c", "d", 2, {"ref": NoiseFloor(
        {("loss", "loss"): (0.0, 1e-7)})}).to_json())
    doc["references"]["ref"]["grad|dense/kernel"] = series
    with pytest.raises(ValueError, match=says) as raised:
        Calibration.from_json(json.dumps(doc), "calibration.json")
    assert "ref" in str(raised.value) and "grad|dense/kernel" in str(raised.value)


# ---- 7. ^C ends with one line ------------------------------------------------------------------

def test_calibrate_interrupted_ends_with_one_line_and_writes_nothing(calibrate, tmp_path,
                                                                    monkeypatch, capsys):
    run, _ = calibrate

    def interrupted(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)   # as ^C in the terminal
        raise AssertionError("not interrupted")

    monkeypatch.setattr("verify.tools.calibration.calibrate_case", interrupted)
    before = signal.signal(signal.SIGINT, signal.default_int_handler)   # (a background job
    try:                                                                # ignores SIGINT)
        status = run("--out", str(tmp_path / "calibration.json"))
    finally:
        signal.signal(signal.SIGINT, before)
    err = capsys.readouterr().err
    assert status == 130 and len(err.strip().splitlines()) == 1 and "interrupted" in err, err
    assert not (tmp_path / "calibration.json").exists()
    assert not list(tmp_path.glob(".calibration.json*"))


# ---- found by the second probe (20 new bad inputs) ---------------------------------------------

def test_merge_refuses_an_out_that_is_one_of_its_shards(shards, capsys):
    before = (shards[0] / "run.json").read_text()
    assert main(["report", "merge", *map(str, shards), "--out", str(shards[0])]) == 2
    assert "would replace the shard's own" in capsys.readouterr().err
    assert (shards[0] / "run.json").read_text() == before


def test_init_names_a_user_module_that_calls_sys_exit(tmp_path, monkeypatch, capsys):
    status = _init(tmp_path, monkeypatch, "import sys\nsys.exit(3)\n")
    err = capsys.readouterr().err
    assert status == 2 and "SystemExit" in err and "sys.exit(3)" in err, err


def test_calibrate_merge_of_other_steps_is_refused_before_measuring(calibrate, tmp_path,
                                                                    capsys):
    run, measured = calibrate
    out = tmp_path / "calibration.json"
    assert run("--out", str(out), "--steps", "2") == 0 and len(measured) == 1
    assert run("--out", str(out), "--merge") == 2 and len(measured) == 1   # the case's 4 steps
    assert "2 steps" in capsys.readouterr().err


@pytest.mark.slow   # builds the user's Keras model: TensorFlow (nothing is trained)
def test_init_names_a_model_builder_whose_tensorflow_call_raised(tmp_path, monkeypatch, capsys):
    (tmp_path / "pipeline_tf_mistake.py").write_text(
        "import numpy as np\nimport tensorflow as tf\nfrom verify import Examples\n\n"
        "def build(steps_per_execution):\n"
        "    return tf.zeros([2]) + tf.zeros([3])   # the user's shape mistake\n\n"
        "def loop():\n    pass\n\n"
        "def examples():\n    return Examples({'x': np.zeros((8, 2))}, labels=np.zeros(8))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("verify.runners.capture.devices.configure_cpu_replicas", lambda *a: None)
    status = main(["init", "my_case", "--keras", "pipeline_tf_mistake:build",
                   "pipeline_tf_mistake:examples", "--loop", "pipeline_tf_mistake:loop",
                   "--examples", "pipeline_tf_mistake:examples", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert status == 2 and "InvalidArgumentError" in err and "--keras" in err, err
    assert "tf.zeros([2]) + tf.zeros([3])" in err and "internal error" not in err
