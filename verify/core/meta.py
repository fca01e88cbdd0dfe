"""What a trace says about the run that produced it: a typed record, written by the runner's
own process, so a trace from another environment or machine carries that environment.

>>> meta = TraceMeta(case="demo", implementation="tf2", replicas=2,
...                  details={"strategy": "MirroredStrategy"})
>>> TraceMeta.from_dict(meta.to_dict()) == meta
True
>>> TraceMeta.from_dict({"replicas": 2, "strategy": "x"}).details
{'strategy': 'x'}
"""
from __future__ import annotations

import dataclasses
import os
import platform
import sys
from pathlib import Path
from typing import Any


SUITE_ENVIRONMENT = "local"   # the environment the suite itself runs in


def current_environment() -> str:
    """The name of the environment this process runs in: a worker process started for a
    declared environment is told its name (`PARITY_ENVIRONMENT`); else the suite's own."""
    return os.environ.get("PARITY_ENVIRONMENT") or SUITE_ENVIRONMENT


@dataclasses.dataclass
class Environment:
    """Versions and machine facts that a drift figure depends on.

    `name` is the environment an implementation ran in (the suite's own is "local").
    """

    name: str = "local"
    python: str = ""
    numpy: str = ""
    tensorflow: str = ""
    platform: str = ""
    cpu: str = ""
    # The other frameworks a run used, when it imported them ("" otherwise): a report names a
    # destination side by them (Keras 3, tf_keras, JAX).
    keras: str = ""
    tf_keras: str = ""
    jax: str = ""

    KEYS = ("tensorflow", "numpy", "python", "platform", "cpu")

    @classmethod
    def current(cls, name: str | None = None) -> "Environment":
        """This process's environment (named `current_environment()` unless `name` is given).
        Versions are read only from modules already imported, so recording an environment
        never imports TensorFlow, Keras or JAX."""
        name = name or current_environment()
        import numpy

        def version(module: str) -> str:
            imported = sys.modules.get(module)
            return str(getattr(imported, "__version__", "")) if imported else ""

        return cls(name=name, python=platform.python_version(), numpy=numpy.__version__,
                   tensorflow=version("tensorflow"), platform=platform.platform(),
                   cpu=_cpu_model(), keras=version("keras"), tf_keras=version("tf_keras"),
                   jax=version("jax"))

    def facts(self) -> dict[str, str]:
        """The facts compared between runs (`KEYS`), as a dict."""
        return {key: getattr(self, key) for key in self.KEYS}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


@dataclasses.dataclass
class TraceMeta:
    """Facts about one run. `details` holds what only some runners know (strategy,
    steps_per_execution, iterations_per_loop, data source, timings)."""

    case: str = ""
    implementation: str = ""
    steps: int | None = None
    device: str = "cpu"
    seed: int | None = None
    data_digest: str = ""          # Case.data_digest() of the case it was run on
    replicas: int | None = None   # None until the runner or the harness says
    # "every step" or "boundaries"; a run captured at boundaries has `capture_every` > 1
    capture: str = "every step"
    capture_every: int = 1
    seconds: float | None = None
    environment: Environment = dataclasses.field(default_factory=Environment)
    runner: dict[str, Any] = dataclasses.field(default_factory=dict)         # describe()
    declared_config: dict[str, Any] = dataclasses.field(default_factory=dict)
    details: dict[str, Any] = dataclasses.field(default_factory=dict)
    # What the device let this run see: quantity -> tensor -> why it was never captured (table
    # gradients on a TPU), and quantity -> tensor -> k for values read every k-th step only
    # (tables read back from a TPU's embedding engine); tensors in canonical names.
    not_captured: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
    read_every: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> "TraceMeta":
        """A record from its dict; unknown keys go to `details` (older traces, runner facts)."""
        doc = dict(doc or {})
        fields = {f.name for f in dataclasses.fields(cls)}
        known = {k: doc.pop(k) for k in list(doc) if k in fields}
        env = known.get("environment")
        if isinstance(env, dict):
            env_fields = {f.name for f in dataclasses.fields(Environment)}
            known["environment"] = Environment(**{k: v for k, v in env.items()
                                                  if k in env_fields})
        details = dict(known.pop("details", {}) or {})
        env_facts = {k: doc.pop(k) for k in Environment.KEYS if k in doc}
        if env_facts and "environment" not in known:
            known["environment"] = Environment(**env_facts)
        details.update(doc)
        if known.get("steps") is not None:
            known["steps"] = int(known["steps"])
        if known.get("replicas") is not None:
            known["replicas"] = int(known["replicas"])
        known["capture_every"] = int(known.get("capture_every", 1))
        return cls(**known, details=details)
