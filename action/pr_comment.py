"""Publish a parity run on its pull request: the job summary and ONE comment, kept up to date.

The GitHub Action (action.yml) calls this after the suite ran; it also runs locally:

    GITHUB_EVENT_PATH=event.json GITHUB_REPOSITORY=owner/repo GH_TOKEN=... \\
        python action/pr_comment.py --summary reports/summary.md --status 1

It appends summary.md to $GITHUB_STEP_SUMMARY (when set), then, on a pull-request event, finds
the pull request's comment holding MARKER (`gh api .../issues/N/comments`) and updates it
(PATCH), or creates it (POST) when there is none: one comment per pull request, rewritten on
every push. Outside a pull request (no pull_request.number in the event) it posts nothing and
says so.

Exit status: the suite's (--status), whatever happened to the comment. A comment that cannot be
posted (no `gh` on PATH, no token, a read-only token on a pull request from a fork, an API
error) is a warning: the verdict is the suite's, and the job summary and the uploaded report
still carry it. Python standard library only; the GitHub API is reached through the `gh` CLI.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

MARKER = "<!-- tf-migration-parity -->"
MAX_BODY = 60_000    # GitHub refuses comments over 65,536 characters


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


def pull_request_number(event_path: str | None) -> int | None:
    """The pull request's number from the event file ($GITHUB_EVENT_PATH), or None.

    >>> pull_request_number(None) is None
    True
    """
    if not event_path or not Path(event_path).is_file():
        return None
    event = json.loads(Path(event_path).read_text())
    number = (event.get("pull_request") or {}).get("number")
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--summary", default="reports/summary.md",
                        help="the run's summary.md (default reports/summary.md)")
    parser.add_argument("--status", type=int, required=True,
                        help="the suite's exit status: this script exits with it")
    parser.add_argument("--run-url", default="", help="link to the workflow run")
    parser.add_argument("--marker", default=MARKER,
                        help=f"the hidden text that identifies the comment (default {MARKER})")
    args = parser.parse_args(argv)

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
