"""`pip install .` (a user's environment, the GitHub Action) gets what the suite needs to run and
nothing of the documentation or lint tool chain: those live in the `docs` and `dev` extras, which
the README's first command and .ci/run install."""
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL_CHAIN = ("mkdocs", "mkdocs-material", "mkdocstrings", "mkdocstrings-python", "zizmor",
              "import-linter", "pyyaml")


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def names(requirements: list[str]) -> set[str]:
    """The distribution names of requirement strings, normalized (`Foo_Bar[x]>=1` -> `foo-bar`)."""
    return {re.split(r"[\s\[<>=!~;@]", r, maxsplit=1)[0].lower().replace("_", "-")
            for r in requirements}


def test_the_runtime_dependencies_hold_no_docs_or_lint_tool():
    runtime = names(project()["dependencies"])
    assert not runtime & set(TOOL_CHAIN), sorted(runtime & set(TOOL_CHAIN))
    assert {"tensorflow", "keras", "numpy", "pytest"} <= runtime


def test_the_dev_extra_holds_the_docs_extra_and_every_tool_the_tests_use():
    extras = project()["optional-dependencies"]
    assert {"mkdocs", "mkdocstrings-python"} <= names(extras["docs"])
    dev = names(extras["dev"])
    assert any(r.startswith("tf-migration-parity[docs") for r in extras["dev"])
    assert {"zizmor", "import-linter", "pyyaml"} <= dev


def test_a_tool_chain_requirement_among_the_runtime_ones_is_seen():
    """Negative control: the check above flags mkdocs put back into the runtime list."""
    runtime = names([*project()["dependencies"], "mkdocs==1.6.1"])
    assert runtime & set(TOOL_CHAIN) == {"mkdocs"}


def test_ci_and_the_readme_install_the_dev_extra_and_the_action_only_the_runtime():
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install --quiet --disable-pip-version-check -e ".[dev]"' in ci
    assert "python3.11 -m venv" in ci or "python=python3.11" in ci
    install = quick_start((ROOT / "README.md").read_text())[0]
    assert install.startswith('pip install -e ".[dev]" && pytest verify/')
    action = (ROOT / "action.yml").read_text()
    (install,) = [line for line in action.splitlines() if "pip install" in line]
    assert install.rstrip().endswith('"$ACTION_PATH"'), install   # no extra


def quick_start(markdown: str) -> list[str]:
    """The commands of a page's first bash block, each without its comment."""
    block = markdown.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


def command_differences(readme: str, index: str, ci: str) -> list[str]:
    """Where the docs index's quick start is not the README's, or the pytest line .ci/run runs
    is not the README's test command (its quick start's second command)."""
    commands = quick_start(readme)
    ci_line = next((line.strip() for line in ci.splitlines() if line.startswith("pytest")), "")
    found = [f"docs/index.md: {quick_start(index)!r}"] if quick_start(index) != commands else []
    return found + ([f".ci/run: {ci_line!r}"] if ci_line != commands[1] else [])


def test_ci_runs_the_test_command_the_readme_and_the_docs_give():
    readme = (ROOT / "README.md").read_text()
    assert len(quick_start(readme)) == 2
    assert command_differences(readme, (ROOT / "docs" / "index.md").read_text(),
                               (ROOT / ".ci" / "run").read_text()) == []


def test_a_ci_script_or_docs_page_giving_another_command_is_seen():
    """Negative controls: a .ci/run whose pytest line is not the README's second command, and a
    docs index whose quick start installs otherwise."""
    page = "```bash\npip install x  # install\npytest -n 3  # tests\n```\n"
    assert command_differences(page, page, "set +e\npytest -n 3\n") == []
    assert command_differences(page, page, "set +e\npytest -n 2\n") == [
        ".ci/run: 'pytest -n 2'"]
    other = page.replace("pip install x", "pip install y")
    assert command_differences(page, other, "pytest -n 3\n") == [
        "docs/index.md: ['pip install y', 'pytest -n 3']"]
