"""The commands of `python -m verify` (verify/__main__.py), one module per command family.

Each module adds its commands' parsers to the subcommands `verify.__main__` builds (in the
order its help lists them) and holds what the commands run: `arguments` (bad input, the
options several commands share), `reports` (compare, report), `runs` (run, serve),
`calibrate`, `environments` (envs), `checkpoint` (checkpoint convert), `run_history`
(history list, history compare) and `doctor`.
"""
