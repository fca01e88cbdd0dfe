"""Environments an implementation declares (`declared`: built with uv or venv + pip, with the
suite's packages where asked) and the pool of environment processes that run implementations
in them (`pool`)."""
