"""Migrations under test, shipped with the suite. Each module or package here that defines
`CASE` (a `verify.Case`), `CASES` (a list of them) or `cases(options)` (a function of the
session's `SuiteOptions` returning a list) is picked up by `pytest verify/`; nothing in
`verify/` names them. Cases kept elsewhere are run with `--cases PATH_OR_MODULE`
(see `verify.runners.case_sources`).
"""
