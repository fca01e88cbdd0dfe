"""One writer of traces: `verify/runners/capture/step_record.py` is the only code that calls
`Trace.record` or writes a trace's values, and `verify/runners/` names no quantity by a literal
(the names come from `verify/core/quantities.py`'s table). Each check is shown to fail, naming
file and line, on a copy of the tree with one wrong line added."""
import ast
import shutil
from pathlib import Path

from verify.core.quantities import NAMES

ROOT = Path(__file__).resolve().parents[2]
WRITER = Path("verify/runners/capture/step_record.py")
TRACE = Path("verify/core/trace.py")    # defines record; core builds traces it loads
# Literals equal to a quantity's name that name no quantity: (file, literal) -> (count, why).
NOT_QUANTITIES = {
    (WRITER, "loss"): (1, "the key Keras' and an Estimator's evaluate() return the loss under"),
    (Path("verify/runners/capture/taps.py"), "run"): (
        1, "the attribute strategy.run, which the batch tap wraps for a run"),
    (Path("verify/runners/lazy.py"), "run"): (1, "a runner's run method"),
}


def _python_files(root: Path, under: str):
    for path in sorted((root / under).rglob("*.py")):
        yield path.relative_to(root), ast.parse(path.read_text())


def trace_writes(root: Path) -> list[str]:
    """Every call of `.record(` in `verify/` (no other `record` method exists there: a call
    is `Trace.record`), and every item written or deleted in a `.values` mapping or shared
    into one (`.values.share(`) under `verify/runners/`, outside the writer and core/trace.py;
    as 'path:line what'. Docstring examples are strings, not calls, and are not seen."""
    found = []
    for path, tree in _python_files(root, "verify"):
        if path in (WRITER, TRACE):
            continue
        runners = path.parts[:2] == ("verify", "runners")
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr == "record" or (runners and node.func.attr == "share"
                                                  and _is_values(node.func.value)):
                    found.append(f"{path}:{node.lineno} .{node.func.attr}(")
            targets = (node.targets if isinstance(node, (ast.Assign, ast.Delete)) else
                       [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else [])
            for target in targets:
                if runners and isinstance(target, ast.Subscript) and _is_values(target.value):
                    found.append(f"{path}:{node.lineno} .values[...] written")
    return found


def _is_values(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "values"


def quantity_literals(root: Path) -> list[str]:
    """Every string literal under `verify/runners/` equal to a quantity's name, as
    'path:line "name"', but those `NOT_QUANTITIES` lists (each expected as often as it says)."""
    found, allowed = [], {key: count for key, (count, _) in NOT_QUANTITIES.items()}
    for path, tree in _python_files(root, "verify/runners"):
        literals = [n for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in NAMES]
        for node in sorted(literals, key=lambda n: (n.lineno, n.col_offset)):   # first allowed
            if allowed.get((path, node.value), 0) > 0:
                allowed[(path, node.value)] -= 1
                continue
            found.append(f'{path}:{node.lineno} "{node.value}"')
    return sorted(found)


def test_the_step_recorder_is_the_only_writer_of_traces():
    assert trace_writes(ROOT) == []


def test_runners_name_no_quantity_by_a_literal():
    assert quantity_literals(ROOT) == []


def test_the_allowed_literals_are_still_there():
    """An allowance no longer needed is removed, not kept to hide a later literal."""
    for (path, literal), (count, _) in NOT_QUANTITIES.items():
        tree = ast.parse((ROOT / path).read_text())
        seen = sum(isinstance(n, ast.Constant) and n.value == literal for n in ast.walk(tree))
        assert seen == count, f"{path}: {literal!r} {seen} times, allowed {count}"


def _copy(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "verify", tmp_path / "verify",
                    ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def _append(path: Path, text: str) -> int:
    """Append `text` to `path`; the line number it starts at."""
    lines = path.read_text().count("\n")
    path.write_text(path.read_text() + text)
    return lines + 1


def test_a_second_writer_is_named_with_its_file_and_line(tmp_path):
    root = _copy(tmp_path)
    line = _append(root / "verify/runners/loop/runner.py",
                   "\n\ndef _extra(trace):\n    trace.record(1, LOSS, LOSS, 0.0)\n")
    shared = _append(root / "verify/runners/run.py",
                     "\n\ndef _extra(out, native, key):\n    out.values[key] = native.values[key]"
                     "\n    out.values.share(native.values, key, key)\n")
    outside = _append(root / "verify/store/history.py", "\n\ndef _extra(t):\n    t.record()\n")
    assert trace_writes(root) == [
        f"verify/runners/loop/runner.py:{line + 3} .record(",
        f"verify/runners/run.py:{shared + 3} .values[...] written",
        f"verify/runners/run.py:{shared + 4} .share(",
        f"verify/store/history.py:{outside + 3} .record(",
    ]


def test_a_quantity_literal_in_a_runner_is_named_with_its_file_and_line(tmp_path):
    root = _copy(tmp_path)
    line = _append(root / "verify/runners/keras/tpu.py", '\n\nQUANTITY = "slot"\n')
    # an allowed literal, once more than allowed, is named too
    again = _append(root / "verify/runners/lazy.py", '\n\nMETHOD = "run"\n')
    assert quantity_literals(root) == [f'verify/runners/keras/tpu.py:{line + 2} "slot"',
                                       f'verify/runners/lazy.py:{again + 2} "run"']
