"""Running a parity session: the pytest plugin and everything a session does between the
command line and the report.

- `plugin` (registered with pytest as `verify.session.plugin`) and `plugin_options` (its
  command-line options), `parity_controller` (which process runs pairs), `interruption`
  (Ctrl-C and SIGTERM), `suite` (`python -m verify suite`);
- `parity_session` (`ParitySession`: select pairs, judge them, write the report),
  `session_end` (the run record, kept traces, the report directory readied for the next run);
- `trace_supply` (each implementation's trace, run at most once per process),
  `layer_replay` (a diverging pair run again layer by layer), `substitution`,
  `backward_substitution` and `update_substitution` with `substitution_values` (its first
  divergent layer, backward pass or optimizer update run on the same values on both sides:
  local or carried in, and a standalone repro).

A session sits above `verify.render`, `verify.store`, `verify.judge` and `verify.core` (the
import contracts in pyproject.toml); it starts runs through `verify.runners` and
`verify.environments`.
"""
