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
