"""Where the workers of a multi-worker run are: a loopback cluster made here, or the one a
cluster manager describes in `TF_CONFIG`.

`TF_CONFIG` is the JSON every `tf.distribute.MultiWorkerMirroredStrategy` worker reads:
the cluster (`"chief"`: one address, `"worker"`: a list) and this process's task. Workers are
numbered as TensorFlow numbers them (its `id_in_cluster`): the chief first, then the workers
in order; worker 0 is the chief when the cluster names none. Replicas are numbered from the
worker's number times the replicas per worker.

>>> cluster = Cluster(("127.0.0.1:5000", "127.0.0.1:5001"))
>>> json.loads(cluster.tf_config(1))["task"]
{'type': 'worker', 'index': 1}
>>> Cluster.from_tf_config(cluster.tf_config(1)).task
1
"""
from __future__ import annotations

import dataclasses
import errno
import json
import os
import socket
from typing import Any

ENVIRONMENT = "TF_CONFIG"


class ClusterConfigError(ValueError):
    """A `TF_CONFIG` this suite cannot run a multi-worker case with; the message says why."""


@dataclasses.dataclass(frozen=True)
class Cluster:
    """The addresses of the workers (`host:port`, in TensorFlow's worker order) and which of
    them this process is (`task`, None for the process that only starts and watches them).
    `has_chief`: the first address is a `"chief"` task rather than worker 0."""

    addresses: tuple[str, ...]
    task: int | None = None
    has_chief: bool = False

    def __post_init__(self):
        if not self.addresses:
            raise ClusterConfigError("a cluster needs at least one worker")
        if self.task is not None and not 0 <= self.task < len(self.addresses):
            raise ClusterConfigError(f"task {self.task} is not one of the "
                                     f"{len(self.addresses)} workers")

    @property
    def workers(self) -> int:
        return len(self.addresses)

    @classmethod
    def loopback(cls, workers: int) -> "Cluster":
        """`workers` workers on 127.0.0.1, each on a port free right now (the system picks
        them; a port taken again before the worker binds it fails that worker's start, which
        the runner retries with new ports)."""
        return cls(tuple(f"127.0.0.1:{port}" for port in free_ports(workers)))

    def tf_config(self, task: int) -> str:
        """The `TF_CONFIG` of worker `task`."""
        if self.has_chief:
            spec = {"chief": [self.addresses[0]], "worker": list(self.addresses[1:])}
            kind, index = ("chief", 0) if task == 0 else ("worker", task - 1)
        else:
            spec = {"worker": list(self.addresses)}
            kind, index = "worker", task
        return json.dumps({"cluster": spec, "task": {"type": kind, "index": index}})

    @classmethod
    def from_tf_config(cls, text: str) -> "Cluster":
        """The cluster a `TF_CONFIG` describes, and this process's place in it.

        >>> Cluster.from_tf_config('{"cluster": {"chief": ["a:1"], "worker": ["b:1"]}, '
        ...                        '"task": {"type": "worker", "index": 0}}').task
        1
        >>> Cluster.from_tf_config('{"cluster": {"ps": ["a:1"]}, "task": {}}')
        Traceback (most recent call last):
        ...
        verify.runners.loop.cluster.ClusterConfigError: TF_CONFIG: a "ps" job belongs to ParameterServerStrategy; MultiWorkerMirroredStrategy clusters hold "chief" and "worker" tasks only
        """
        try:
            doc = json.loads(text)
        except ValueError as e:
            raise ClusterConfigError(f"{ENVIRONMENT} is not JSON ({e}); it looks like "
                                     f'{{"cluster": {{"worker": ["host:port", ...]}}, '
                                     f'"task": {{"type": "worker", "index": 0}}}}') from None
        spec, task = _mapping(doc, "cluster"), _mapping(doc, "task")
        for job in spec:
            if job == "ps":
                raise ClusterConfigError(
                    f'{ENVIRONMENT}: a "ps" job belongs to ParameterServerStrategy; '
                    f'MultiWorkerMirroredStrategy clusters hold "chief" and "worker" tasks only')
            if job not in ("chief", "worker", "evaluator"):
                raise ClusterConfigError(f'{ENVIRONMENT}: unknown job {job!r} (expected '
                                         f'"chief" and "worker")')
        chief, workers = _addresses(spec, "chief"), _addresses(spec, "worker")
        if len(chief) > 1:
            raise ClusterConfigError(f'{ENVIRONMENT}: a cluster has at most one "chief", '
                                     f'got {len(chief)}')
        kind, index = task.get("type"), task.get("index", 0)
        if kind == "evaluator":
            raise ClusterConfigError(f"{ENVIRONMENT}: this process is the evaluator; a "
                                     f"parity run trains, so run it on the chief and workers")
        if kind not in ("chief", "worker") or not isinstance(index, int):
            raise ClusterConfigError(f'{ENVIRONMENT}: "task" must be {{"type": "chief" or '
                                     f'"worker", "index": N}}, got {task!r}')
        own = chief if kind == "chief" else workers
        if not 0 <= index < len(own):
            raise ClusterConfigError(f"{ENVIRONMENT}: task {kind} {index} is not in the "
                                     f"cluster's {len(own)} {kind} address(es)")
        offset = len(chief) if kind == "worker" else 0
        return cls(tuple(chief + workers), offset + index, has_chief=bool(chief))

    @classmethod
    def from_environment(cls) -> "Cluster | None":
        """The cluster `TF_CONFIG` describes when the environment sets it (a cluster manager
        does on real hosts), else None."""
        text = os.environ.get(ENVIRONMENT, "").strip()
        return cls.from_tf_config(text) if text else None


def _mapping(doc: Any, key: str) -> dict:
    value = doc.get(key) if isinstance(doc, dict) else None
    if not isinstance(value, dict):
        raise ClusterConfigError(f'{ENVIRONMENT} needs a "{key}" object, got {value!r}')
    return value


def _addresses(spec: dict, job: str) -> list[str]:
    value = spec.get(job, [])
    if not isinstance(value, list) or not all(isinstance(a, str) and ":" in a for a in value):
        raise ClusterConfigError(f'{ENVIRONMENT}: "{job}" must be a list of "host:port" '
                                 f'addresses, got {value!r}')
    return list(value)


def free_ports(count: int) -> list[int]:
    """`count` distinct TCP ports on 127.0.0.1 that nothing listens on right now."""
    sockets = []
    try:
        for _ in range(count):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def accepting(address: str, timeout: float = 1.0) -> bool:
    """Whether something accepts TCP connections at `address` (`host:port`, `[v6]:port`): a
    worker that has started its strategy listens on its address.

    >>> accepting("127.0.0.1:%d" % free_ports(1)[0])
    False
    """
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            return True
    except (OSError, ValueError):
        return False


def port_in_use(address: str) -> bool:
    """Whether this machine cannot listen on `address`'s port because another process does
    (a worker's own address in `TF_CONFIG`; any other bind failure is TensorFlow's to report).
    """
    _, _, port = address.rpartition(":")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # as gRPC binds: a port with connections still in TIME_WAIT is free to listen on
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", int(port)))
        except OSError as e:
            return e.errno == errno.EADDRINUSE
        except ValueError:
            return False
    return False

