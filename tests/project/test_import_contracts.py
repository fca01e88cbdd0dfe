"""The layering of verify/ (pyproject.toml's [tool.importlinter] contracts) holds, and the
check is live: a back-import added to a copy of the package breaks it."""
import ast
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")



def lint(where: Path) -> subprocess.CompletedProcess:
    """lint-imports on the `verify` package found first from `where` (its own directory)."""
    assert LINT.exists(), ('import-linter is not installed: it is in the dev extra '
                           '(pip install -e ".[dev]")')
    return subprocess.run([str(LINT), "--config", str(where / "pyproject.toml"), "--no-cache"],
                          cwd=where, capture_output=True, text=True, timeout=300,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(where)})


def test_the_import_contracts_hold():
    result = lint(ROOT)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("module, back_import, broken", [
    # a runner kind reaching into another kind
    ("verify/runners/loop/runner.py", "from verify.runners.keras import evaluation",
     "Runner kinds never import one another"),
    # the shared capture importing the run entry above it: a circle hidden in a function
    ("verify/runners/capture/taps.py", "def _late():\n    from verify.runners import run",
     "No import circle"),
    # the judge importing a runner
    ("verify/judge/verdict.py", "from verify.runners.capture import taps",
     "Everything after the trace never imports a runner"),
    # storage reaching up into a tool (no circle: only the top-level layering catches it)
    ("verify/store/tolerance_documents.py", "from verify.tools import name_proposals",
     "The top level: commands over tools"),
])
def test_a_back_import_breaks_a_contract(tmp_path, module, back_import, broken):
    shutil.copytree(ROOT / "verify", tmp_path / "verify",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    assert lint(tmp_path).returncode == 0           # the copy holds, as the checkout does
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n\n{back_import}\n")
    result = lint(tmp_path)
    assert result.returncode != 0, result.stdout[-3000:]
    assert broken in result.stdout.split("Broken contracts")[-1], result.stdout[-3000:]


# What every runner kind shares, not a kind: the only package under verify/runners/ that is one.
SHARED = {"capture"}


def unlisted_runner_kinds(root: Path) -> list[str]:
    """What keeps a runner kind (a package under verify/runners/ other than the shared capture)
    from being checked and offered: 'KIND: why' for each kind missing from the two runner
    contracts of pyproject.toml or exported by nothing in verify/__init__.py, and for each
    listed kind that has no package."""
    kinds = {d.name for d in (root / "verify" / "runners").iterdir()
             if (d / "__init__.py").is_file()} - SHARED
    contracts = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["importlinter"]
    by_name = {c["name"]: c for c in contracts["contracts"]}
    independent = set(by_name["Runner kinds never import one another"]["modules"])
    layers = by_name["Runners: the kinds over the run entry over the shared capture over core"]
    top = {m.strip() for m in layers["layers"][0].split("|")}
    init = ast.parse((root / "verify" / "__init__.py").read_text())
    homes = next(ast.literal_eval(node.value) for node in init.body
                 if isinstance(node, ast.AnnAssign | ast.Assign) and "_HOMES" in ast.unparse(node))
    exported = {module.split(".")[2] for module in homes if module.startswith("verify.runners.")}
    missing = []
    for kind in sorted(kinds | {m.rsplit(".", 1)[1] for m in independent | top}):
        module = f"verify.runners.{kind}"
        why = [what for what, holds in (
            ("no package verify/runners/" + kind, kind in kinds),
            ("not in the contract 'Runner kinds never import one another'", module in independent),
            ("not in the top layer of the contract 'Runners: the kinds over ...'", module in top),
            ("no runner of it exported by verify/__init__.py (_HOMES)", kind in exported))
               if not holds]
        missing += [f"{kind}: {'; '.join(why)}"] if why else []
    return missing


def test_every_runner_kind_is_in_the_runner_contracts_and_exported():
    assert unlisted_runner_kinds(ROOT) == []


def test_a_runner_kind_left_out_of_the_contracts_is_named(tmp_path):
    """Adding a kind as docs/explanation/architecture.md says, in a copy: the folder alone is
    named, the folder with its export and its contract lines is checked by lint-imports."""
    shutil.copytree(ROOT / "verify", tmp_path / "verify",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    kind = tmp_path / "verify" / "runners" / "jax"
    kind.mkdir()
    (kind / "__init__.py").write_text('"""A runner kind for JAX training steps."""\n')
    (kind / "runner.py").write_text("from verify.runners.run import run_implementation\n\n\n"
                                    "class JaxRunner:\n    pass\n")
    assert unlisted_runner_kinds(tmp_path) == [
        "jax: not in the contract 'Runner kinds never import one another'; not in the top layer "
        "of the contract 'Runners: the kinds over ...'; no runner of it exported by "
        "verify/__init__.py (_HOMES)"]
    init = tmp_path / "verify" / "__init__.py"
    init.write_text(init.read_text().replace(
        '    "verify.checkpoint":', '    "verify.runners.jax.runner": ("JaxRunner",),\n'
        '    "verify.checkpoint":'))
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace(
        '"verify.runners.loop"]', '"verify.runners.loop", "verify.runners.jax"]').replace(
        '| verify.runners.loop",', '| verify.runners.loop | verify.runners.jax",'))
    assert unlisted_runner_kinds(tmp_path) == []
    assert lint(tmp_path).returncode == 0
    (kind / "runner.py").write_text((kind / "runner.py").read_text()
                                    + "from verify.runners.keras import evaluation\n")
    result = lint(tmp_path)
    assert "Runner kinds never import one another" in result.stdout.split("Broken contracts")[-1]
