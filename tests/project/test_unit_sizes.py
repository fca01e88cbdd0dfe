"""Small units: no module of `verify/` over 400 lines, no function over 60 (its docstring
included), so that a newcomer reads any unit whole."""
import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_MODULE, MAX_FUNCTION = 400, 60


def oversized(package: Path) -> list[str]:
    """Each module of `package` over MAX_MODULE lines and each function over MAX_FUNCTION,
    as 'path: N lines' and 'path:line name: N lines'."""
    found = []
    for path in sorted(package.rglob("*.py")):
        source = path.read_text()
        name = path.relative_to(package.parent)
        if source.count("\n") > MAX_MODULE:
            found.append(f"{name}: {source.count(chr(10))} lines")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION:
                    found.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    return found


def test_no_module_or_function_of_verify_is_oversized():
    assert oversized(ROOT / "verify") == []


def test_the_check_sees_an_oversized_module_and_function(tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION))
    (package / "long.py").write_text("def long():\n" + body + "\n" + "\n" * MAX_MODULE)
    (package / "short.py").write_text("def short():\n    return 1\n")
    assert oversized(package) == [f"pkg/long.py: {MAX_FUNCTION + 1 + MAX_MODULE} lines",
                                  f"pkg/long.py:1 long: {MAX_FUNCTION + 1} lines"]
