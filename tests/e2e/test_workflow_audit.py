"""The GitHub Actions security audit of the action and the workflows: zizmor, offline, finds
nothing (and finds what it should in copies with an unpinned action, a template expansion in a
script, a persisted checkout credential, a write permission at the top level); every
suppression is one of the two listed here with its reason; every `uses:` is pinned to a commit
with its release in a comment; and the fork pattern's two workflows have the shape that makes
it safe (the pull request's run read-only, the workflow_run job without checkout and with only
the permissions it needs)."""
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_pr_action import load_yaml_file

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
ACTIONS = [ROOT / "action.yml", ROOT / "action" / "post-comment" / "action.yml"]
AUDITED = [*ACTIONS, WORKFLOWS]

# The findings silenced with `# zizmor: ignore[...]`, each a deliberate design with its reason
# in a comment beside it: the workflow_run trigger IS the fork pattern (pull-request-comment.yml),
# and `$/` cannot name a repository's root action (pull-request.yml's `uses: ./`).
IGNORED = {("dangerous-triggers", "pull-request-comment.yml"),
           ("self-repository", "pull-request.yml")}

PINNED = re.compile(r"^[\w.-]+/[\w.-]+(/[\w./-]+)?@[0-9a-f]{40} # v\d+\.\d+\.\d+$")


def zizmor_command() -> str:
    found = shutil.which("zizmor") or shutil.which("zizmor", path=str(Path(sys.executable).parent))
    assert found, "zizmor is not installed: it is in the dev extra (pip install -e \".[dev]\")"
    return found


def audit(*inputs: Path, options: tuple[str, ...] = ()) -> list[dict]:
    """zizmor's findings (offline, the default persona) on `inputs`; a file it cannot parse is a
    failure, not a warning."""
    done = subprocess.run([zizmor_command(), "--offline", "--strict-collection", "--no-progress",
                           "--no-exit-codes", "--format", "json", *options, *map(str, inputs)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]      # findings or not; not a tool failure
    return json.loads(done.stdout)


def where(finding: dict) -> str:
    """file name:line of a finding's primary location."""
    primary = next(loc for loc in finding["locations"] if loc["symbolic"]["kind"] == "Primary")
    local = primary["symbolic"]["key"].get("Local") or {}
    path = Path(local.get("verbatim_path") or local.get("given_path") or "?")
    return f"{path.name}:{primary['concrete']['location']['start_point']['row'] + 1}"


def test_the_action_and_the_workflows_pass_zizmor_offline():
    findings = audit(*AUDITED)
    assert findings == [], "\n".join(f"{f['ident']} at {where(f)}: {f['desc']}"
                                     for f in findings)


def test_only_the_listed_findings_are_silenced_and_each_says_why():
    silenced = audit(*AUDITED, options=("--no-ignores",))
    assert {(f["ident"], where(f).split(":")[0]) for f in silenced} == IGNORED
    for ident, name in IGNORED:
        text = (WORKFLOWS / name).read_text()
        lines = text.splitlines()
        (at,) = [n for n, line in enumerate(lines) if f"# zizmor: ignore[{ident}]" in line]
        above = at
        while lines[above - 1].strip().startswith("#"):   # the comment block just above it
            above -= 1
        reason = " ".join(lines[above:at])
        assert ident in reason and len(reason) > 200, reason


CHECKOUT = "actions/checkout@11d5960a326750d5838078e36cf38b85af677262 # v4.4.0"
NIGHTLY_PARITY_PERMISSIONS = """    permissions:
      contents: read   # check out the code
      issues: write    # post the summary on the issue PARITY_ISSUE, when that variable is set
"""
# Worse copies: (file, [(text, replacement), ...], the audit that must then find something).
MUTATIONS = {
    "an unpinned action": (WORKFLOWS / "pull-request.yml",
                           [(CHECKOUT, "actions/checkout@v4")], "unpinned-uses"),
    "an unpinned action in the action": (
        ROOT / "action.yml",
        [("actions/setup-python@a26af69be951a213d495a4c3e4e4022e16d87065 # v5.6.0",
          "actions/setup-python@v5")], "unpinned-uses"),
    "a checkout that keeps its credential": (
        WORKFLOWS / "pull-request.yml",
        [("        with:\n          persist-credentials: false\n", "")], "artipacked"),
    "issues write for the whole nightly workflow": (
        WORKFLOWS / "nightly.yml",
        [("permissions: {}", "permissions:\n  contents: read\n  issues: write"),
         (NIGHTLY_PARITY_PERMISSIONS, "")], "excessive-permissions"),
    "a template expansion in a script": (
        WORKFLOWS / "nightly.yml",
        [('test "$SUITE_STATUS" = "0"', 'test "${{ steps.suite.outputs.status }}" = "0"')],
        "template-injection"),
    "an input expanded into the action's script": (
        ROOT / "action.yml",
        [('python -m verify suite --cases "$CASES"',
          'python -m verify suite --cases "${{ inputs.cases }}"')], "template-injection"),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_zizmor_finds_what_it_should_in_a_worse_copy(tmp_path, mutation):
    """Negative controls: the audit above passes because the files are right, not because
    zizmor saw nothing."""
    source, replacements, ident = MUTATIONS[mutation]
    text = source.read_text()
    assert audit(source) == []
    for before, after in replacements:
        assert text.count(before) == 1, before
        text = text.replace(before, after)
    copy = tmp_path / source.name
    copy.write_text(text)
    found = {f["ident"] for f in audit(copy)}
    assert ident in found, found


def uses_lines() -> list[tuple[str, str]]:
    lines = []
    for path in [*ACTIONS, *sorted(WORKFLOWS.glob("*.yml"))]:
        for line in path.read_text().splitlines():
            match = re.match(r"\s*(?:- )?uses:\s*(.*)$", line)
            if match:
                lines.append((path.name, match[1]))
    return lines


def test_every_action_is_pinned_to_a_commit_with_its_release_in_a_comment():
    releases: dict[str, set[str]] = {}
    for name, reference in uses_lines():
        if reference.startswith(("./", "$/")):
            continue                          # this repository's own code
        assert PINNED.match(reference), f"{name}: uses: {reference}"
        sha_and_tag = reference.split("@", 1)[1]
        releases.setdefault(reference.split("@")[0].split("/")[1], set()).add(sha_and_tag)
    # one action repository, one commit and one release everywhere
    assert all(len(pins) == 1 for pins in releases.values()), releases
    assert {"checkout", "setup-python", "upload-artifact", "download-artifact",
            "cache"} <= set(releases)


def test_the_pull_request_run_is_read_only_and_hands_the_comment_over():
    workflow = load_yaml_file(WORKFLOWS / "pull-request.yml")
    assert workflow["on"] == {"pull_request": None}
    assert workflow["permissions"] == {}
    (job,) = workflow["jobs"].values()
    assert job["permissions"] == {"contents": "read"}
    checkout, action = job["steps"]
    assert checkout["with"] == {"persist-credentials": False}
    assert action["uses"] == "./" and action["with"]["comment"] == "artifact"


def test_the_comment_workflow_posts_with_write_permission_and_runs_nothing_of_the_pull_request():
    workflow = load_yaml_file(WORKFLOWS / "pull-request-comment.yml")
    pull_request = load_yaml_file(WORKFLOWS / "pull-request.yml")
    assert workflow["on"] == {"workflow_run": {"workflows": [pull_request["name"]],
                                               "types": ["completed"]}}
    assert workflow["permissions"] == {}
    (job,) = workflow["jobs"].values()
    assert job["permissions"] == {"actions": "read", "pull-requests": "write"}
    assert "github.event.workflow_run.event == 'pull_request'" in job["if"]
    # no checkout, no script of its own: only this repository's post-comment action, at this
    # workflow's commit (the default branch's), which downloads the artifact and posts
    assert job["steps"] == [{"uses": "$/action/post-comment"}]
    post = load_yaml_file(ROOT / "action" / "post-comment" / "action.yml")
    for step in post["runs"]["steps"]:
        assert "checkout" not in step.get("uses", "")
        assert "${{" not in step.get("run", "")
        for exported in ("GITHUB_ENV", "GITHUB_OUTPUT", "GITHUB_PATH"):
            assert exported not in step.get("run", "")


def test_the_nightly_workflow_grants_each_job_only_what_it_needs():
    workflow = load_yaml_file(WORKFLOWS / "nightly.yml")
    assert workflow["permissions"] == {}
    jobs = workflow["jobs"]
    assert jobs["goldens"]["permissions"] == {"contents": "read"}
    assert jobs["shards"]["permissions"] == {"contents": "read"}
    assert jobs["parity"]["permissions"] == {"contents": "read", "issues": "write"}
    # the shards each run `--shard K/N` for every K of the matrix; the parity job joins them
    shards = jobs["shards"]
    assert shards["env"]["SHARDS"] == len(shards["strategy"]["matrix"]["shard"]) == 3
    assert '--shard "$SHARD/$SHARDS"' in shards["steps"][-2]["run"]
    assert "python -m verify report merge shards/parity-shard-*" in \
        [s for s in jobs["parity"]["steps"] if s.get("id") == "suite"][0]["run"]
    for job in jobs.values():
        for step in job["steps"]:
            if step.get("uses", "").startswith("actions/checkout@"):
                assert step["with"]["persist-credentials"] is False
            assert "${{" not in step.get("run", ""), step.get("name", step.get("id"))


def test_the_readmes_example_workflows_pass_zizmor_too(tmp_path):
    """What the documentation tells other teams to write (docs/how-to/pr-action.md) is held to
    the same audit (its placeholders filled with a made-up owner and commit)."""
    section = (ROOT / "docs" / "how-to" / "pr-action.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 2, "the guide shows the pull-request and the comment workflow"
    for n, block in enumerate(blocks):
        filled = block.replace("<owner>", "example-org").replace(
            "<commit SHA> # <tag>", "0123456789abcdef0123456789abcdef01234567 # v1.0.0")
        assert "<" not in filled.replace("<!--", ""), filled
        (tmp_path / f"example-{n}.yml").write_text(filled)
        load_yaml_file(tmp_path / f"example-{n}.yml")          # the subset the tests read
    assert audit(tmp_path / "example-0.yml", tmp_path / "example-1.yml") == []
    pull_request, comment = (load_yaml_file(tmp_path / f"example-{n}.yml") for n in (0, 1))
    assert comment["on"]["workflow_run"]["workflows"] == [pull_request["name"]]
    assert pull_request["jobs"]["parity"]["steps"][1]["with"]["comment"] == "artifact"
