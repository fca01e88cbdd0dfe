"""The report directory between runs: what a new run removes of an earlier one's files."""


def test_a_new_run_removes_the_repros_an_earlier_one_wrote_and_nothing_else(tmp_path):
    from verify.store.report_dir import REPRO_FILES, mark_in_progress

    earlier = tmp_path / "repro" / "case" / "tf1--control"
    earlier.mkdir(parents=True)
    for name in REPRO_FILES:
        (earlier / name).write_text("")
    mine = tmp_path / "repro" / "case" / "notes"
    mine.mkdir()
    (mine / "repro.json").write_text("{}")
    (mine / "my-notes.txt").write_text("kept")
    mark_in_progress(tmp_path, "run-2")
    assert not earlier.exists() and (mine / "my-notes.txt").read_text() == "kept"


def test_once_summary_md_says_in_progress_no_other_file_holds_the_earlier_verdict(
        tmp_path, monkeypatch):
    """summary.md (what CI and a reader poll) is written last: whenever it says IN PROGRESS,
    report.html and run.json already do."""
    from verify.core import files
    from verify.store.report_dir import mark_in_progress

    for name, earlier in (("summary.md", "## Parity: PASS\n"), ("report.html", "<h1>PASS</h1>"),
                          ("run.json", '{"verdict": "PASS"}')):
        (tmp_path / name).write_text(earlier)
    seen = []
    original = files.write_atomic

    def write_atomic(path, content, *args, **kwargs):
        result = original(path, content, *args, **kwargs)
        seen.append({name: (tmp_path / name).read_text() for name in
                     ("summary.md", "report.html", "run.json")})
        return result

    monkeypatch.setattr(files, "write_atomic", write_atomic)
    mark_in_progress(tmp_path, "run-3")
    assert len(seen) == 3
    for state in seen:
        if "IN PROGRESS" in state["summary.md"]:
            assert "IN PROGRESS" in state["report.html"] and "IN PROGRESS" in state["run.json"]
    assert "IN PROGRESS" in seen[-1]["summary.md"]
