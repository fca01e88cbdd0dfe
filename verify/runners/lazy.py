"""Runners named by where they are defined, built on first use.

A case module declares every implementation, but each runs in its own environment: the TF1
side needs `tf.estimator` (gone in TF 2.16), a tfrs side needs tfrs, a keras-rs side Keras 3.
`lazy_runner("module:factory", **arguments)` names a runner without importing its module, so
the case module imports in every environment and only the process that runs an implementation
imports its code.

>>> runner = lazy_runner("collections:OrderedDict", a=1)
>>> runner
lazy_runner('collections:OrderedDict', a=1)
>>> dict(runner.resolve())
{'a': 1}
"""
from __future__ import annotations

import importlib
from typing import Any


class LazyRunnerError(ImportError):
    """The module or attribute a lazy runner names cannot be imported or built."""


class LazyRunner:
    """A `Runner` built on first use from `target` ("module:attribute").

    The attribute is a runner, or a factory called with `arguments` that returns one. Every
    `Runner` method and attribute is passed to the built runner.
    """

    def __init__(self, target: str, arguments: dict[str, Any] | None = None):
        module, sep, attribute = target.partition(":")
        if not sep or not module or not attribute:
            raise ValueError(f"a lazy runner names 'module:attribute' (e.g. "
                             f"'cases.my_case.tf2:make_runner'), got {target!r}")
        self.target, self.arguments = target, dict(arguments or {})
        self._runner = None

    def resolve(self):
        """The runner, imported and built on the first call."""
        if self._runner is None:
            module_name, _, attribute = self.target.partition(":")
            try:
                module = importlib.import_module(module_name)
            except Exception as e:  # noqa: BLE001 - re-raised with what to do
                raise LazyRunnerError(
                    f"the runner {self.target} cannot be built here: importing {module_name} "
                    f"failed ({type(e).__name__}: {e}); does this implementation name the "
                    f"environment it runs in (Implementation(environment=...))?") from e
            try:
                found = getattr(module, attribute)
            except AttributeError:
                raise LazyRunnerError(f"the runner {self.target}: module {module_name} has no "
                                      f"attribute {attribute!r}") from None
            self._runner = (found if hasattr(found, "run") and not self.arguments
                            else found(**self.arguments))
        return self._runner

    def run(self, request):
        return self.resolve().run(request)

    def describe(self) -> dict[str, Any]:
        return self.resolve().describe()

    def declared_config(self, case, implementation) -> dict[str, Any]:
        return self.resolve().declared_config(case, implementation)

    def __getattr__(self, name: str):
        if name.startswith("_") or name in ("target", "arguments"):
            raise AttributeError(name)
        return getattr(self.resolve(), name)

    def __repr__(self) -> str:
        arguments = "".join(f", {k}={v!r}" for k, v in self.arguments.items())
        return f"lazy_runner({self.target!r}{arguments})"


def lazy_runner(target: str, **arguments) -> LazyRunner:
    """A runner named by "module:attribute", imported and built (called with `arguments`) only
    when an implementation runs: see the module docstring."""
    return LazyRunner(target, arguments)
