"""Publish a parity run on its pull request: the job summary and ONE comment, kept up to date.

The GitHub Action (action.yml) calls this after the suite ran; it also runs locally:

    GITHUB_EVENT_PATH=event.json GITHUB_REPOSITORY=owner/repo GH_TOKEN=... \\
        python action/pr_comment.py --summary reports/summary.md --status 1

It appends summary.md to $GITHUB_STEP_SUMMARY (when set), then, on a pull-request event, does
what --comment says:

- `post` (the default): finds the pull request's comment holding MARKER (`gh api
  .../issues/N/comments`) and updates it (PATCH), or creates it (POST) when there is none: one
  comment per pull request, rewritten on every push;
- `artifact`: posts nothing and writes what the comment needs into --comment-dir
  (pull-request.json: {"number": N, "status": S}, and a copy of summary.md), for the action to
  upload and a `workflow_run` workflow to post (a pull request from a fork gets a read-only
  token, so its own run cannot comment);
- `off`: posts nothing.

Outside a pull request (no pull_request.number in the event) it posts nothing and says so.
Exit status: the suite's (--status), whatever happened to the comment. A comment that cannot be
posted (no `gh` on PATH, no token, a read-only token on a pull request from a fork, an API
error) is a warning: the verdict is the suite's, and the job summary and the uploaded report
still carry it.

The other side of `artifact`, in the `workflow_run` job (action/post-comment/action.yml):

    python action/pr_comment.py --from-artifact DIR

reads DIR/pull-request.json and DIR/summary.md as UNTRUSTED input (a fork's code wrote them):
the number and the status must be plain JSON integers in range, both files regular files (not
links), nothing in them is executed or written anywhere but into the comment's text, and the
comment goes to that pull request only when its head commit is the one the finished run tested
(workflow_run.head_sha of $GITHUB_EVENT_PATH, checked with `gh api .../pulls/N`). Exit status:
0 posted, or nothing to post (not a pull-request run; the pull request has moved on); 1 the
artifact was refused or the comment could not be posted.

Python standard library only; the GitHub API is reached through the `gh` CLI.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

MARKER = "<!-- tf-migration-parity -->"
MAX_BODY = 60_000    # GitHub refuses comments over 65,536 characters
MODES = ("post", "artifact", "off")
CONTEXT_FILE = "pull-request.json"    # what --comment artifact writes beside summary.md
MAX_CONTEXT_BYTES = 4096
MAX_ISSUE_NUMBER = 2**31 - 1


class CommentError(RuntimeError):
    """The comment could not be read or written; the message says why."""


def comment_body(summary: str | None, status: int, run_url: str = "",
                 marker: str = MARKER) -> str:
    """The comment: the marker, a status line, then summary.md (clipped to fit a comment).

    >>> comment_body("parity: PASS", 0).splitlines()[:3]
    ['<!-- tf-migration-parity -->', '**tf-migration-parity**: suite exit status 0 (passed)', '']
    """
    outcome = {0: "passed", 1: "failed", 2: "interrupted", 3: "internal error",
               4: "usage error", 5: "no test collected"}.get(status, "failed")
    head = f"**tf-migration-parity**: suite exit status {status} ({outcome})"
    if run_url:
        head += f" · [run and report artifact]({run_url})"
    if summary is None:
        text = ("The suite wrote no summary.md: it stopped before writing a report. The job log "
                "says why.")
    elif len(summary) > MAX_BODY:
        text = summary[:MAX_BODY] + "\n\n… summary.md clipped here; the full report is in the " \
                                    "run's artifact."
    else:
        text = summary
    return f"{marker}\n{head}\n\n{text}\n"


def read_event(event_path: str | None) -> dict:
    """The event's payload ($GITHUB_EVENT_PATH), {} when there is none."""
    if not event_path or not Path(event_path).is_file():
        return {}
    event = json.loads(Path(event_path).read_text())
    return event if isinstance(event, dict) else {}


def pull_request_number(event_path: str | None) -> int | None:
    """The pull request's number from the event file ($GITHUB_EVENT_PATH), or None.

    >>> pull_request_number(None) is None
    True
    """
    number = (read_event(event_path).get("pull_request") or {}).get("number")
    return int(number) if number is not None else None


def gh_api(*args: str, body: dict | None = None) -> object:
    """`gh api ARGS` (with `body` as the request's JSON); the parsed answer.

    >>> gh_api("repos/owner/repo/issues/7/comments", "--paginate")  # doctest: +SKIP
    [{'id': 1, 'body': '...'}]
    """
    gh = shutil.which("gh")
    if gh is None:
        raise CommentError("the gh CLI is not on PATH: install it (it is preinstalled on "
                           "GitHub-hosted runners) or put it on PATH to get the comment")
    with tempfile.TemporaryDirectory() as tmp:
        command = [gh, "api", *args]
        if body is not None:
            request = Path(tmp) / "body.json"
            request.write_text(json.dumps(body))
            command += ["--input", str(request)]
        done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise CommentError(f"gh api {' '.join(args)} failed (exit {done.returncode}): "
                           f"{(done.stderr or done.stdout).strip()[-800:]}")
    return _json_documents(done.stdout)


def _json_documents(text: str) -> object:
    """One JSON document, or the pages `gh api --paginate` prints one after another, joined."""
    decoder, pages, at = json.JSONDecoder(), [], 0
    while at < len(text.rstrip()):
        while text[at].isspace():
            at += 1
        page, at = decoder.raw_decode(text, at)
        pages.append(page)
    if len(pages) == 1:
        return pages[0]
    return [item for page in pages for item in (page if isinstance(page, list) else [page])]


def publish(repository: str, number: int, body: str, marker: str = MARKER) -> str:
    """Update the pull request's comment holding `marker`, or create it; what was done.

    >>> publish("owner/repo", 7, comment_body("parity: PASS", 0))  # doctest: +SKIP
    'updated comment 123 on owner/repo#7'
    """
    comments = gh_api(f"repos/{repository}/issues/{number}/comments", "--paginate")
    if not isinstance(comments, list):
        raise CommentError(f"listing the comments of {repository}#{number} gave "
                           f"{type(comments).__name__}, not a list: {str(comments)[:300]}")
    ours = [c for c in comments if marker in (c.get("body") or "")]
    if ours:
        comment_id = ours[0]["id"]
        gh_api("--method", "PATCH", f"repos/{repository}/issues/comments/{comment_id}",
               body={"body": body})
        return f"updated comment {comment_id} on {repository}#{number}"
    created = gh_api("--method", "POST", f"repos/{repository}/issues/{number}/comments",
                     body={"body": body})
    return f"created comment {created.get('id')} on {repository}#{number}"


class ArtifactError(ValueError):
    """The comment artifact is refused; the message says why."""


def write_comment_artifact(directory: Path, number: int, status: int,
                           summary: str | None) -> None:
    """What the `workflow_run` side needs to post the comment: the pull request's number, the
    suite's status and summary.md (absent when the suite wrote none).

    >>> import tempfile; out = Path(tempfile.mkdtemp())
    >>> write_comment_artifact(out, 7, 1, "## Parity: FAIL")
    >>> sorted(p.name for p in out.iterdir()), read_comment_artifact(out)
    (['pull-request.json', 'summary.md'], (7, 1, '## Parity: FAIL'))
    """
    directory.mkdir(parents=True, exist_ok=True)
    (directory / CONTEXT_FILE).write_text(json.dumps({"number": number, "status": status}))
    if summary is not None:
        (directory / "summary.md").write_text(summary)


def _regular_file(path: Path, limit: int) -> bytes | None:
    """Up to `limit` bytes of `path`, None when it does not exist; ArtifactError unless it is
    a regular file (a link could point the comment at any file of the runner; O_NONBLOCK: a
    FIFO must not hang the job before fstat refuses it)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return None
    except OSError as e:
        raise ArtifactError(f"{path.name} cannot be opened as a regular file ({e.strerror})")
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ArtifactError(f"{path.name} is not a regular file")
        return f.read(limit)


def _integer(context: dict, key: str, low: int, high: int) -> int:
    value = context.get(key)
    if type(value) is not int or not low <= value <= high:   # bool, str, float: refused
        raise ArtifactError(f"{CONTEXT_FILE}: {key} must be a JSON integer from {low} to "
                            f"{high}, not {json.dumps(value)[:80]}")
    return value


def read_comment_artifact(directory: Path) -> tuple[int, int, str | None]:
    """(pull request number, suite status, summary.md or None) of an artifact written by
    write_comment_artifact, validated as untrusted input; ArtifactError when refused.

    >>> import tempfile; out = Path(tempfile.mkdtemp())
    >>> _ = (out / CONTEXT_FILE).write_text('{"number": "7 --method DELETE", "status": 0}')
    >>> try:
    ...     read_comment_artifact(out)
    ... except ArtifactError as e:
    ...     print(e)
    pull-request.json: number must be a JSON integer from 1 to 2147483647, not "7 --method DELETE"
    """
    raw = _regular_file(directory / CONTEXT_FILE, MAX_CONTEXT_BYTES + 1)
    if raw is None:
        raise ArtifactError(f"{directory} holds no {CONTEXT_FILE}")
    if len(raw) > MAX_CONTEXT_BYTES:
        raise ArtifactError(f"{CONTEXT_FILE} is over {MAX_CONTEXT_BYTES} bytes")
    try:
        context = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ArtifactError(f"{CONTEXT_FILE} is not JSON: {e}") from None
    if not isinstance(context, dict):
        raise ArtifactError(f"{CONTEXT_FILE} is not a JSON object")
    number = _integer(context, "number", 1, MAX_ISSUE_NUMBER)
    status = _integer(context, "status", 0, 255)
    summary = _regular_file(directory / "summary.md", 4 * MAX_BODY + 4)
    return number, status, None if summary is None else summary.decode("utf-8", "replace")


def post_from_artifact(directory: Path, event: dict, repository: str,
                       marker: str = MARKER) -> str:
    """Post (or update) the comment of a finished pull-request run from its artifact, in a
    `workflow_run` job; what was done. CommentError/ArtifactError when it cannot."""
    run = event.get("workflow_run")
    if not isinstance(run, dict):
        raise CommentError("the event has no workflow_run: --from-artifact runs in a job "
                           "triggered by `on: workflow_run`")
    if run.get("event") != "pull_request":
        return f"the run was triggered by {run.get('event')!r}, not a pull request: nothing " \
               f"to post"
    head_sha = str(run.get("head_sha") or "")
    if not re.fullmatch(r"[0-9a-f]{40}", head_sha):
        raise CommentError(f"workflow_run.head_sha is not a commit SHA: {head_sha[:80]!r}")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+", repository):
        raise CommentError(f"$GITHUB_REPOSITORY is not owner/name: {repository[:80]!r}")
    number, status, summary = read_comment_artifact(directory)
    pull = gh_api(f"repos/{repository}/pulls/{number}")
    pull_head = ((pull.get("head") or {}).get("sha") or "") if isinstance(pull, dict) else ""
    if pull_head != head_sha:
        return (f"{repository}#{number}'s head is {pull_head[:12] or 'unknown'}, the run tested "
                f"{head_sha[:12]}: not posting (the pull request moved on, or the artifact names "
                f"another pull request)")
    run_url = str(run.get("html_url") or "")
    if not run_url.startswith("https://"):
        run_url = ""
    return publish(repository, number, comment_body(summary, status, run_url, marker), marker)


def main_from_artifact(args: argparse.Namespace) -> int:
    repository = os.environ.get("GITHUB_REPOSITORY", "")
    try:
        event = read_event(os.environ.get("GITHUB_EVENT_PATH"))
        done = post_from_artifact(Path(args.from_artifact), event, repository, args.marker)
    except ArtifactError as e:
        print(f"::error::pr_comment: the comment artifact is refused, nothing posted: {e}")
        return 1
    except (CommentError, OSError, ValueError) as e:
        print(f"::error::pr_comment: no comment posted: {e}")
        return 1
    print(f"pr_comment: {done}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--summary", default="reports/summary.md",
                        help="the run's summary.md (default reports/summary.md)")
    parser.add_argument("--status", type=int,
                        help="the suite's exit status: this script exits with it (required "
                             "unless --from-artifact)")
    parser.add_argument("--run-url", default="", help="link to the workflow run")
    parser.add_argument("--marker", default=MARKER,
                        help=f"the hidden text that identifies the comment (default {MARKER})")
    parser.add_argument("--comment", choices=MODES, default="post",
                        help="post the comment from here (default), write it for a "
                             "workflow_run job to post (artifact), or neither (off)")
    parser.add_argument("--comment-dir", default="parity-comment",
                        help="with --comment artifact: where to write pull-request.json and "
                             "summary.md (default parity-comment)")
    parser.add_argument("--from-artifact", metavar="DIR",
                        help="in a workflow_run job: post the comment of the finished "
                             "pull-request run from its downloaded comment artifact DIR")
    args = parser.parse_args(argv)
    if args.from_artifact is not None:
        return main_from_artifact(args)
    if args.status is None:
        parser.error("--status is required (unless --from-artifact)")

    summary_path = Path(args.summary)
    summary = summary_path.read_text() if summary_path.is_file() else None
    if summary is None:
        print(f"pr_comment: {summary_path} does not exist (the suite wrote no report)",
              file=sys.stderr)
    step_summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if step_summary:
        with open(step_summary, "a") as out:
            out.write((summary or comment_body(None, args.status)) + "\n")

    number = pull_request_number(os.environ.get("GITHUB_EVENT_PATH"))
    repository = os.environ.get("GITHUB_REPOSITORY", "")
    if number is None:
        print("pr_comment: not a pull request (no pull_request.number in $GITHUB_EVENT_PATH): "
              "no comment posted")
        return args.status
    if args.comment == "off":
        print("pr_comment: comment off: no comment posted")
        return args.status
    if args.comment == "artifact":
        write_comment_artifact(Path(args.comment_dir), number, args.status, summary)
        print(f"pr_comment: wrote {args.comment_dir}/{CONTEXT_FILE} for pull request #{number}: "
              f"a workflow_run job posts the comment")
        return args.status
    if not repository:
        print("::warning::pr_comment: $GITHUB_REPOSITORY is not set: no comment posted")
        return args.status
    try:
        print("pr_comment: " + publish(repository, number,
                                       comment_body(summary, args.status, args.run_url,
                                                    args.marker), args.marker))
    except (CommentError, OSError, ValueError) as e:
        print(f"::warning::pr_comment: no comment posted: {e}")
    return args.status


if __name__ == "__main__":
    sys.exit(main())
