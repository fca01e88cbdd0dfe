"""The layout of tests/ (docs/development.md): the tests of `verify/<package>/<module>.py` in
`tests/<package>/test_<module>.py`, whole sessions in tests/e2e/, project-wide checks in
tests/project/, the shipped cases' in tests/cases/; no test file at the top of tests/, and no
two test files of one name (the folders are not packages: pytest would refuse the second)."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# the folders of tests/ that mirror no package of verify/
OWN_FOLDERS = {"cases", "e2e", "project"}


def misplaced(root: Path) -> list[str]:
    """Each test file under `root`/tests that breaks the layout, saying why and what to do."""
    tests, package = root / "tests", root / "verify"
    found, by_name = [], {}
    for path in sorted([*tests.rglob("test_*.py"), *package.rglob("test_*.py")]):
        where = path.relative_to(root).as_posix()
        by_name.setdefault(path.name, []).append(where)
        if not path.is_relative_to(tests):
            continue
        folder = path.parent.relative_to(tests)
        if not folder.parts:
            found.append(f"{where}: at the top of tests/; move it to tests/<package>/ of the "
                         "package it tests (tests/e2e/, tests/project/ or tests/cases/)")
        elif folder.parts[0] not in OWN_FOLDERS and not (package / folder / "__init__.py").exists():
            found.append(f"{where}: tests/{folder.as_posix()}/ mirrors no package "
                         f"verify/{folder.as_posix()}/; move it to the folder of its package")
    found += [f"{' and '.join(paths)}: one file name twice; rename one (the test folders are "
              "not packages)" for paths in by_name.values() if len(paths) > 1]
    return found


def test_the_tests_mirror_the_packages():
    assert misplaced(ROOT) == []


def test_a_loose_file_a_folder_of_no_package_and_a_name_twice_are_found(tmp_path):
    (tmp_path / "verify" / "judge").mkdir(parents=True)
    (tmp_path / "verify" / "judge" / "__init__.py").write_text("")
    for name in ("judge/test_verdict.py", "cases/data/x.json", "e2e/test_verdict.py",
                 "test_loose.py", "stages/test_compare.py"):
        (tmp_path / "tests" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "tests" / name).write_text("")
    found = misplaced(tmp_path)
    assert [line.split(":")[0] for line in found] == [
        "tests/stages/test_compare.py", "tests/test_loose.py",
        "tests/e2e/test_verdict.py and tests/judge/test_verdict.py"]
    assert "mirrors no package verify/stages/" in found[0] and "top of tests/" in found[1]
    (tmp_path / "tests" / "test_loose.py").unlink()
    (tmp_path / "tests" / "e2e" / "test_verdict.py").rename(tmp_path / "tests" / "e2e" / "test_x.py")
    assert misplaced(tmp_path) == [found[0]]
