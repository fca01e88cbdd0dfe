"""The documentation site builds strictly (a broken link, anchor or API reference fails it),
holds every command's help and the case API, and the README stays a ten-minute read whose links
all land."""
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


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
        if command.add_help:
            assert f"usage: python -m verify {name}" in page, name


def test_the_api_page_documents_what_a_case_imports(site):
    page = (site / "reference" / "api" / "index.html").read_text()
    for name in ("Case", "Implementation", "NameMap", "KerasRunner", "Keras3Runner",
                 "LoopRunner", "EstimatorRunner", "Tolerances"):
        assert f'id="verify.{name}"' in page, name
    assert 'id="verify.runners.loop.runner.LoopContext"' in page


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
