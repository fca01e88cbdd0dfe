"""`python -m verify repro DIR`: every repro under DIR runs alone (`python -I`, another working
directory), its output and status printed; the command exits 1 when any repro shows its
difference, 0 when none does, 2 when DIR holds none, or any repro's record is damaged or names an
environment not declared (said before any repro runs).
The scripts here are stand-ins (no TensorFlow); the real ones run in
tests/session/test_substitution.py."""
import json
import os

from verify.__main__ import main

SCRIPT = """import os, sys
print("ran from", os.getcwd(), "isolated", sys.flags.isolated)
sys.exit({status})
"""


def write_repro(folder, status, environment="local"):
    folder.mkdir(parents=True)
    (folder / "repro.py").write_text(SCRIPT.format(status=status))
    (folder / "repro.json").write_text(json.dumps({"environment": environment}))
    return folder


def test_each_repro_runs_alone_and_a_difference_exits_1(tmp_path, capsys):
    write_repro(tmp_path / "repro" / "c" / "a--b", 1)
    write_repro(tmp_path / "repro" / "c" / "a--faithful", 0)
    assert main(["repro", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "a--b: exit 1" in out and "a--faithful: exit 0" in out
    assert "isolated 1" in out and f"ran from {tmp_path}" not in out
    assert main(["repro", str(tmp_path / "repro" / "c" / "a--faithful")]) == 0


def test_no_repro_or_an_undeclared_environment_is_bad_input(tmp_path, capsys):
    assert main(["repro", str(tmp_path)]) == 2
    assert "no repro under" in capsys.readouterr().err
    write_repro(tmp_path / "x", 1, environment="nowhere")
    assert main(["repro", str(tmp_path), "--project", str(tmp_path / "pyproject.toml")]) == 2
    assert "does not declare" in capsys.readouterr().err


def test_a_repro_that_raises_is_not_a_difference_shown(tmp_path, capsys):
    """A script that raises exits 1 too (Python's status for an error): the command says it
    raised and exits 2, never 1 (the negative control: the status alone would read a
    difference)."""
    write_repro(tmp_path / "repro" / "c" / "a--faithful", 0)
    broken = write_repro(tmp_path / "repro" / "c" / "a--broken", 0)
    (broken / "repro.py").write_text("import no_such_module_here\n")
    assert main(["repro", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert "a--broken: raised (exit 1)" in captured.out and "ModuleNotFoundError" in captured.out
    assert "a--faithful: exit 0" in captured.out and "did not run to their verdict" in captured.err


def test_every_record_is_checked_before_any_repro_runs(tmp_path, capsys):
    """A later repro whose environment is not declared, or whose record is damaged or
    unreadable, is bad input (exit 2) before the first repro runs (negative control: the
    first repro, sorted ahead of it, would print its exit line had it run)."""
    write_repro(tmp_path / "repro" / "c" / "a--first", 1)
    later = write_repro(tmp_path / "repro" / "c" / "b--later", 1, environment="nowhere")
    assert main(["repro", str(tmp_path), "--project", str(tmp_path / "pyproject.toml")]) == 2
    captured = capsys.readouterr()
    assert "does not declare" in captured.err and "a--first: exit" not in captured.out
    (later / "repro.json").write_text("{not json")
    assert main(["repro", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert "cannot be read as a repro record" in captured.err
    assert "a--first: exit" not in captured.out
    (later / "repro.json").write_text('["local"]')
    assert main(["repro", str(tmp_path)]) == 2
    assert "is not a repro record" in capsys.readouterr().err
    (later / "repro.json").write_text('{"environment": "local"}')
    (later / "repro.json").chmod(0)
    try:
        unreadable = main(["repro", str(tmp_path)])
    finally:
        (later / "repro.json").chmod(0o644)
    captured = capsys.readouterr()
    if os.geteuid() != 0:   # root reads it anyway
        assert unreadable == 2 and "PermissionError" in captured.err
