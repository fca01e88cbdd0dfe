# The parity suite's pytest plugin: options (--tpu, --steps, --report-dir, ...), the trace
# supply, and the report written at the end of the session (see verify/session/plugin.py).
pytest_plugins = ["verify.session.plugin"]
