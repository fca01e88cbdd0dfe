"""The pull-request action: its comment script (action/pr_comment.py) run locally with a fake
event and a stubbed `gh` that records every call and keeps the pull request's comments in a
JSON file; the wheel installs `verify` and no top-level `cases`; and a throwaway migration
repository runs the installed suite through action.yml's own steps."""
import ast
import doctest
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "action" / "pr_comment.py"
MARKER = "<!-- tf-migration-parity -->"
REPO = "owner/migration"

# `gh api` as the script calls it: GET .../issues/N/comments (printed as pages of two, the way
# --paginate prints them), POST a new comment, PATCH one by id. Every call goes to GH_STUB_LOG.
GH_STUB = '''#!{python}
import json, os, sys
from pathlib import Path

args = sys.argv[1:]
body = json.loads(Path(args[args.index("--input") + 1]).read_text()) if "--input" in args else None
with open(os.environ["GH_STUB_LOG"], "a") as log:
    log.write(json.dumps({{"argv": args, "body": body}}) + "\\n")
if os.environ.get("GH_STUB_FAIL"):
    sys.exit("HTTP 403: Resource not accessible by integration")
store = Path(os.environ["GH_STUB_COMMENTS"])
comments = json.loads(store.read_text()) if store.exists() else []
method = args[args.index("--method") + 1] if "--method" in args else "GET"
endpoint = next(a for a in args if a.startswith("repos/"))
if method == "GET" and endpoint.endswith("/comments"):
    for at in range(0, max(len(comments), 1), 2):
        print(json.dumps(comments[at:at + 2]))
elif method == "POST":
    comments.append({{"id": 1000 + len(comments), "body": body["body"]}})
    store.write_text(json.dumps(comments))
    print(json.dumps(comments[-1]))
elif method == "PATCH":
    comment_id = int(endpoint.rsplit("/", 1)[1])
    (match,) = [c for c in comments if c["id"] == comment_id]
    match["body"] = body["body"]
    store.write_text(json.dumps(comments))
    print(json.dumps(match))
else:
    sys.exit(f"gh stub: unexpected call {{args}}")
'''


class GitHub:
    """A fake GitHub around the comment script: event file, stubbed gh, recorded calls."""

    def __init__(self, tmp: Path, event: dict):
        self.tmp, self.bin = tmp, tmp / "bin"
        self.bin.mkdir()
        gh = self.bin / "gh"
        gh.write_text(GH_STUB.format(python=sys.executable))
        gh.chmod(0o755)
        self.log, self.comments = tmp / "gh-calls.jsonl", tmp / "comments.json"
        self.event, self.step_summary = tmp / "event.json", tmp / "step-summary.md"
        self.event.write_text(json.dumps(event))
        self.comments.write_text(json.dumps([
            {"id": 7, "body": "LGTM, but run the suite on TPU too"},
            {"id": 8, "body": "second human comment"},
            {"id": 9, "body": "third human comment"}]))

    def env(self, **extra) -> dict:
        return {**os.environ, "PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}",
                "GH_STUB_LOG": str(self.log), "GH_STUB_COMMENTS": str(self.comments),
                "GITHUB_EVENT_PATH": str(self.event), "GITHUB_REPOSITORY": REPO,
                "GITHUB_STEP_SUMMARY": str(self.step_summary), **extra}

    def run(self, summary: str | None, status: int, **env) -> subprocess.CompletedProcess:
        path = self.tmp / "reports" / "summary.md"
        path.parent.mkdir(exist_ok=True)
        if summary is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(summary)
        return subprocess.run([sys.executable, str(SCRIPT), "--summary", str(path),
                               "--status", str(status), "--run-url", "https://run/1"],
                              env=self.env(**env), capture_output=True, text=True, timeout=60)

    def calls(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def ours(self) -> list[dict]:
        return [c for c in json.loads(self.comments.read_text()) if MARKER in c["body"]]


@pytest.fixture
def github(tmp_path):
    return GitHub(tmp_path, {"action": "synchronize", "pull_request": {"number": 42}})


def methods(calls: list[dict]) -> list[tuple[str, str]]:
    return [(c["argv"][c["argv"].index("--method") + 1] if "--method" in c["argv"] else "GET",
             next(a for a in c["argv"] if a.startswith("repos/"))) for c in calls]


def test_the_first_run_creates_a_comment_with_the_marker_and_the_summary(github):
    done = github.run("## Parity: PASS (3 pairs: 3 pass)\n\nthe table\n", 0)
    assert done.returncode == 0, done.stdout + done.stderr
    assert methods(github.calls()) == [("GET", f"repos/{REPO}/issues/42/comments"),
                                       ("POST", f"repos/{REPO}/issues/42/comments")]
    (comment,) = github.ours()
    assert comment["body"].startswith(MARKER + "\n")
    assert "suite exit status 0 (passed)" in comment["body"]
    assert "## Parity: PASS (3 pairs: 3 pass)\n\nthe table" in comment["body"]
    assert "https://run/1" in comment["body"]
    assert f"created comment {comment['id']} on {REPO}#42" in done.stdout
    assert github.step_summary.read_text().startswith("## Parity: PASS (3 pairs: 3 pass)")


def test_a_second_run_updates_that_comment_instead_of_adding_one(github):
    github.run("## Parity: FAIL (3 pairs: 1 fail, 2 pass)\n", 1)
    (first,) = github.ours()
    again = github.run("## Parity: PASS (3 pairs: 3 pass)\n", 0)
    assert again.returncode == 0, again.stdout + again.stderr
    second_run = github.calls()[2:]
    assert methods(second_run) == [("GET", f"repos/{REPO}/issues/42/comments"),
                                   ("PATCH", f"repos/{REPO}/issues/comments/{first['id']}")]
    assert "## Parity: PASS" in second_run[1]["body"]["body"]
    (comment,) = github.ours()        # still one comment of ours, now saying PASS
    assert comment["id"] == first["id"]
    assert "## Parity: PASS" in comment["body"] and "FAIL" not in comment["body"]
    assert len(json.loads(github.comments.read_text())) == 4   # three human comments + ours
    assert f"updated comment {first['id']} on {REPO}#42" in again.stdout


def test_outside_a_pull_request_nothing_is_posted_and_it_says_so(tmp_path):
    github = GitHub(tmp_path, {"ref": "refs/heads/main", "after": "abc123"})   # a push event
    done = github.run("## Parity: FAIL (1 pair: 1 fail)\n", 1)
    assert done.returncode == 1
    assert github.calls() == []
    assert "not a pull request" in done.stdout and "no comment posted" in done.stdout
    assert "## Parity: FAIL" in github.step_summary.read_text()   # the job summary still is


@pytest.mark.parametrize("status", [0, 1, 3, 4])
def test_the_exit_status_is_the_suites(github, status):
    done = github.run("## Parity: something\n", status)
    assert done.returncode == status
    assert f"suite exit status {status} (" in github.ours()[0]["body"]


def test_a_comment_that_cannot_be_posted_warns_and_keeps_the_suites_status(github, tmp_path):
    refused = github.run("## Parity: PASS\n", 0, GH_STUB_FAIL="1")
    assert refused.returncode == 0
    assert "::warning::pr_comment: no comment posted" in refused.stdout
    assert "HTTP 403" in refused.stdout
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    missing = github.run("## Parity: FAIL\n", 1, PATH=str(empty))   # no gh anywhere
    assert missing.returncode == 1
    assert "the gh CLI is not on PATH" in missing.stdout
    assert github.ours() == []


def test_a_run_that_wrote_no_summary_says_so_in_the_comment(github):
    done = github.run(None, 3)
    assert done.returncode == 3
    body = github.ours()[0]["body"]
    assert "suite exit status 3 (internal error)" in body
    assert "wrote no summary.md" in body
    assert "does not exist" in done.stderr


def test_the_comment_script_uses_the_standard_library_only_and_its_examples_hold():
    tree = ast.parse(SCRIPT.read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree)
                if isinstance(node, ast.Import) for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module}
    assert imported - {"__future__"} <= set(sys.stdlib_module_names), imported
    spec = importlib.util.spec_from_file_location("pr_comment", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = doctest.testmod(module)
    assert result.attempted >= 2 and result.failed == 0
    assert module._json_documents('[{"id": 1}]\n[{"id": 2}]\n') == [{"id": 1}, {"id": 2}]
    assert len(module.comment_body("x" * 70_000, 1)) < 65_536


def test_the_suite_command_passes_pytest_options_through_from_the_working_directory():
    from verify.suite import parity_test_file, suite_command

    command = suite_command(["--", "--cases", "parity_cases", "-n", "2", "-k", "a or b"],
                            cwd=Path("/repo"))
    assert command[0] == str(parity_test_file()) and parity_test_file().parent.name == "verify"
    assert command[command.index("-p") + 1] == "verify.plugin"
    assert command[command.index("-c") + 1] == os.devnull   # not the repository's own config
    assert command[-8:] == ["--rootdir", "/repo", "--cases", "parity_cases", "-n", "2", "-k",
                            "a or b"]
    assert suite_command(["--rootdir=/elsewhere"], cwd=Path("/repo")).count("/repo") == 0


def build_wheel(out: Path) -> Path:
    """The project's wheel, built from a copy of its files (the checkout stays untouched)."""
    source = out / "source"
    source.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    for name in ("verify", "cases"):
        shutil.copytree(ROOT / name, source / name,
                        ignore=shutil.ignore_patterns("__pycache__"))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps",
                           "--no-build-isolation", "--no-cache-dir", "--disable-pip-version-check",
                           "-w", str(out / "dist"), str(source)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (wheel,) = (out / "dist").glob("*.whl")
    return wheel


def test_the_wheel_installs_verify_and_no_top_level_cases(tmp_path):
    wheel = zipfile.ZipFile(build_wheel(tmp_path))
    names = wheel.namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"verify"}
    for module in ("verify/test_parity.py", "verify/plugin.py", "verify/suite.py",
                   "verify/core/case.py", "verify/render/html.py"):
        assert module in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = wheel.read(entry_points).decode()
    assert "tf-migration-parity = verify.__main__:main" in text


# The migration repository's own case, in its own `cases/` package (the action's default).
REPO_CASE = '''
import numpy as np

from verify import Case, Examples, Expectation, Implementation, NameMap, Tolerance, Tolerances


class QuadraticRunner:
    def __init__(self, lr=0.1, grad_offset=0.0):
        self.lr, self.grad_offset = lr, grad_offset

    def run(self, request):
        trace = request.trace
        w = np.asarray(request.initial_values["w"], np.float32)
        trace.record(0, "weight", "w", w)
        for step in range(1, request.steps + 1):
            grad = (w + self.grad_offset).astype(np.float32)
            trace.record(step, "loss", "loss", np.float32((w ** 2).sum() / 2))
            trace.record(step, "grad", "w", grad)
            w = (w - np.float32(self.lr) * grad).astype(np.float32)
            trace.record(step, "weight", "w", w)
        return trace

    def describe(self):
        return {"api": "numpy"}

    def declared_config(self, case, implementation):
        return {"optimizer/model/kind": "sgd", "optimizer/model/learning_rate": self.lr}


def side(name, expect=None, **kw):
    return Implementation(name, QuadraticRunner(**kw), NameMap({"w": "w"}), expect=expect)


CASE = Case(
    name="repo_quadratic", examples=Examples({"x": np.zeros((4, 1))}, labels=np.zeros(4)),
    batch_size=2, steps=3, initial_values={"w": np.linspace(1, 2, 4, dtype=np.float32)},
    implementations=(side("old"), side("new"), side("new-offset", grad_offset=0.5)),
    reference="old", seed=3, pairs=(("old", "new"), ("old", "new-offset")),
    tolerances=Tolerances.default().override(weight=Tolerance(1e-5, 1e-5)))
'''


def action_step(name: str) -> str:
    """The shell script of one of action.yml's steps, as the runner would execute it."""
    yaml = pytest.importorskip("yaml")
    steps = yaml.safe_load((ROOT / "action.yml").read_text())["runs"]["steps"]
    (step,) = [s for s in steps if s.get("name") == name]
    assert step.get("shell") == "bash"
    return step["run"]


@pytest.mark.slow   # runs the parity suite (pytest, TensorFlow's import) in a subprocess
def test_a_throwaway_repository_runs_the_installed_suite_through_the_actions_steps(tmp_path):
    repo = tmp_path / "migration"
    (repo / "cases").mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    (repo / "cases" / "__init__.py").write_text("")
    (repo / "cases" / "quadratic.py").write_text(textwrap.dedent(REPO_CASE))
    site = tmp_path / "site"     # the suite installed from its wheel: no checkout on sys.path
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--disable-pip-version-check", "--target", str(site),
                    str(build_wheel(tmp_path / "wheel"))], check=True, timeout=300)
    assert not (site / "cases").exists()
    github = GitHub(tmp_path, {"pull_request": {"number": 5}})
    # `python` on the action's PATH is this interpreter: a script that runs it by its own path
    # (a symlink to a virtual environment's python, placed elsewhere, starts the base
    # interpreter without the environment's packages)
    (github.bin / "python").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (github.bin / "python").chmod(0o755)
    outputs = tmp_path / "github-output"
    env = github.env(PYTHONPATH=str(site), TF_CPP_MIN_LOG_LEVEL="3", GITHUB_OUTPUT=str(outputs),
                     CASES="cases", PYTEST_OPTIONS="-p no:cacheprovider --replicas 1 -k 'repo_quadratic and old'",
                     GOLDEN_DIR="", ACTION_PATH=str(ROOT), RUN_URL="https://run/9")
    where = subprocess.run(["python", "-c", "import verify; print(verify.__file__)"], cwd=repo,
                           env=env, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(site)), where

    suite = subprocess.run(["bash", "-eo", "pipefail", "-c", action_step("Run the parity suite")],
                           cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert outputs.read_text() == "status=1\n", suite.stdout[-4000:] + suite.stderr[-3000:]
    assert "FAILED" in suite.stdout and "repo_quadratic:old-vs-new-offset" in suite.stdout
    for name in ("summary.md", "report.html", "summary.csv", "run.json"):
        assert (repo / "reports" / name).is_file(), name
    summary = (repo / "reports" / "summary.md").read_text()
    assert summary.startswith("## Parity: FAIL (2 pairs: 1 fail, 1 pass)"), summary[:300]

    env["STATUS"] = outputs.read_text().split("=")[1].strip()
    comment = subprocess.run(["bash", "-eo", "pipefail", "-c",
                              action_step("Job summary and pull-request comment")],
                             cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    assert comment.returncode == 1, comment.stdout + comment.stderr
    (posted,) = github.ours()
    assert posted["body"].startswith(MARKER)
    assert "suite exit status 1 (failed)" in posted["body"] and "https://run/9" in posted["body"]
    assert summary.strip() in posted["body"]
    assert github.step_summary.read_text().strip() == summary.strip()

    # a push to the same pull request runs the action again: the comment is updated, not added
    again = subprocess.run(["bash", "-eo", "pipefail", "-c",
                            action_step("Job summary and pull-request comment")],
                           cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 1, again.stdout + again.stderr
    (updated,) = github.ours()
    assert updated["id"] == posted["id"] and summary.strip() in updated["body"]
    assert methods(github.calls())[-1] == (
        "PATCH", f"repos/{REPO}/issues/comments/{posted['id']}")
