"""The documentation site builds strictly (a broken link, anchor or API reference fails it),
holds every command's help and the case API, and the README stays a ten-minute read whose links
all land."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
                           str(site)], cwd=root, capture_output=True, text=True, timeout=300,
                          env={**__import__("os").environ, "NO_MKDOCS_2_WARNING": "1"})


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(ROOT, out)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "WARNING" not in done.stderr, done.stderr[-3000:]
    return out


def test_the_command_line_page_holds_every_commands_help(site):
    from verify.__main__ import build_parser

    page = (site / "reference" / "cli" / "index.html").read_text()
    commands = next(a for a in build_parser()._actions
                    if a.__class__.__name__ == "_SubParsersAction").choices
    for name, command in commands.items():
        if command.add_help and name != "worker":
            assert f"usage: python -m verify {name}" in page, name
    assert "usage: python -m verify worker" not in page, "the internal command is left out"
    assert page.index("usage: python -m verify init") < page.index(
        "usage: python -m verify names") < page.index("usage: python -m verify calibrate")
    assert "without TensorFlow" not in page


def test_the_build_hook_is_not_published(site):
    assert not (site / "hooks").exists()
    assert not list(site.rglob("cli_help.py"))


def test_the_api_page_documents_what_a_case_imports(site):
    page = (site / "reference" / "api" / "index.html").read_text()
    for name in ("Case", "Implementation", "NameMap", "KerasRunner", "Keras3Runner",
                 "LoopRunner", "EstimatorRunner", "Tolerances"):
        assert f'id="verify.{name}"' in page, name
    assert 'id="verify.runners.loop.runner.LoopContext"' in page
    assert 'id="verify.runners.loop.runner.RestoredState"' in page
    for name in ("Mapped", "Runner", "Expectation", "Tolerance", "Examples", "SparseIds"):
        assert f'id="verify.{name}"' in page, name


def test_the_api_page_shows_the_fields_of_case_and_implementation_and_hides_internals(site):
    page = (site / "reference" / "api" / "index.html").read_text()
    fields = {"Case": ("name", "examples", "batch_size", "steps", "initial_values",
                       "implementations", "reference", "tolerances", "calibration_file"),
              "Implementation": ("name", "runner", "names", "expect", "replicas", "environment"),
              "KerasRunner": ("build_model", "dataset_fn", "steps_per_execution"),
              "EstimatorRunner": ("model_fn", "input_fn", "embedding_config_spec"),
              "Expectation": ("step", "quantity", "why"), "Tolerance": ("atol", "rtol")}
    for owner, names in fields.items():
        for field in names:
            anchor = f'id="verify.{owner}.{field}"'
            assert anchor in page, anchor
            assert len(field_description(page, anchor).split()) >= 3, (anchor, "undescribed")
    for internal in ("pair_specs", "floor_source", "data_digest", "calibrated_references"):
        assert f'id="verify.Case.{internal}"' not in page, internal
    assert "Example::" not in page


def test_the_report_reference_lists_every_column_of_drift_and_summary_csv():
    from verify.judge.records import COLUMNS, PAIR_COLUMNS

    page = (ROOT / "docs" / "reference" / "reports.md").read_text()
    for title, columns in (("drift.csv.gz", COLUMNS), ("summary.csv", PAIR_COLUMNS)):
        table = page.split(f"### Columns of `{title}`", 1)[1].split("\n\n", 2)[2]
        table = table.split("\n\n", 1)[0]
        listed = re.findall(r"`(\w+)`", "\n".join(line.split(" | ")[0] for line in
                                                  table.splitlines()))
        assert set(columns) <= set(listed), sorted(set(columns) - set(listed))


def field_description(page: str, anchor: str) -> str:
    """The text of the member's own description: what follows its heading up to the end of
    its `doc-contents` block (empty when the member has no docstring)."""
    after = page.split(anchor, 1)[1].split("</h3>", 1)[1]
    contents = after.split("</div>", 1)[0]
    return re.sub(r"<[^>]+>", " ", contents) if "doc-contents" in contents else ""


def test_a_field_without_a_docstring_shows_no_description():
    """Negative control of the check above, on the HTML mkdocstrings writes for a member
    without a docstring (heading only) and with one."""
    bare = ('<h3 id="verify.Case.steps" class="doc doc-heading">steps</h3>\n</div>\n'
            '<div class="doc doc-object"><h3 id="verify.Case.next">next</h3>'
            '<div class="doc doc-contents "><p>Some other field words here</p></div>')
    assert field_description(bare, 'id="verify.Case.steps"').split() == []
    described = ('<h3 id="verify.Case.steps">steps</h3><div class="doc doc-contents ">'
                 '<p>Training steps each run</p></div>')
    assert field_description(described, 'id="verify.Case.steps"').split() == [
        "Training", "steps", "each", "run"]


def test_a_broken_link_fails_the_build(tmp_path):
    """Negative control: the same site with one link to a page that does not exist."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copy(ROOT / "mkdocs.yml", tmp_path / "mkdocs.yml")
    with open(tmp_path / "docs" / "limitations.md", "a") as page:
        page.write("\nSee [the missing page](missing.md).\n")
    done = build(tmp_path, tmp_path / "site")
    assert done.returncode != 0
    assert "missing.md" in done.stderr and "Aborted" in done.stdout + done.stderr


def test_the_readme_is_short_and_its_links_land():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 200
    assert readme.split("\n## ")[1].startswith("Quick start")
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", readme)
    local = [link for link in links if not link.startswith("http")]
    assert local, "the README points into the documentation"
    for link in local:
        assert (ROOT / link).exists(), link
