"""What the workers of a multi-worker run write, and joining it into one trace
(`verify.runners.loop.multi_worker`): each worker's directory (`output_dir`), what its
replicas consumed step by step (`ReplicaLog`), the checkpoint paths it wrote and its error
(`WorkerOutput`, read back by `collect_outputs`); `join_outputs` fills the run's trace from
them, and `shared_checkpoints` finds the paths more than one worker wrote (`SharedCheckpoint`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from verify.core.quantities import INPUT, LOSS
from verify.core.trace import Trace
from verify.runners.capture.step_record import StepRecorder


@dataclasses.dataclass(frozen=True)
class CheckpointWrite:
    path: str
    after_step: int
    workers: tuple[int, ...] = ()


class SharedCheckpoint(RuntimeError):
    """Two or more workers wrote a checkpoint to the same path."""

    def __init__(self, shared: list["CheckpointWrite"], also: str = ""):
        first = shared[0]
        paths = "; ".join(f"{w.path} by workers {', '.join(map(str, w.workers))}"
                          for w in shared[:5])
        more = f" and {len(shared) - 5} more" if len(shared) > 5 else ""
        super().__init__(
            f"workers wrote the same checkpoint path after step {first.after_step}: {paths}"
            f"{more}. "
            f"On a shared filesystem they race (one worker's save can delete the files another "
            f"is merging, or leave a mixed checkpoint). Have the chief (the 'chief' task, or "
            f"worker 0 of a cluster without one) save to the real path and every other worker "
            f"to a temporary path of its own; the run "
            f"is judged up to step {first.after_step}"
            + (f"\nA worker also failed (in the race, or later):\n{also}" if also else ""))
        self.shared = shared


@dataclasses.dataclass
class WorkerOutput:
    """What one worker wrote: its replicas' losses and batches per step, the checkpoint
    paths it wrote (after which step), its error if it raised, and (the chief) its trace."""

    worker: int
    losses: dict[int, dict[int, np.ndarray]]                 # step -> replica -> loss
    batches: dict[int, dict[int, dict[str, Any]]]            # step -> replica -> batch
    checkpoints: list[tuple[str, int]]
    error: str | None = None
    trace: Trace | None = None


def output_dir(run_dir: Path, worker: int) -> Path:
    return Path(run_dir) / f"worker-{worker}"


class ReplicaLog:
    """A worker's record of what its replicas consumed, step by step (`StepTaps.on_replicas`).

    >>> import tempfile
    >>> log = ReplicaLog()
    >>> log.add(1, {2: np.float32(0.5)}, {2: {"x": np.ones(2)}})
    >>> path = log.save(Path(tempfile.mkdtemp()) / "replicas.npz")
    >>> losses, batches = ReplicaLog.load(path)
    >>> float(losses[1][2]), batches[1][2]["x"].tolist()
    (0.5, [1.0, 1.0])
    """

    def __init__(self):
        self.arrays: dict[str, np.ndarray] = {}

    def add(self, step: int, losses: Mapping[int, Any], batches: Mapping[int, Mapping]) -> None:
        for replica, loss in losses.items():
            self.arrays[f"{step}/{replica}/{LOSS}"] = np.asarray(loss, np.float32)
        for replica, batch in batches.items():
            for name, value in batch.items():
                if isinstance(value, tuple):     # sparse: (indices, values, dense_shape)
                    for part, array in zip(("indices", "values", "shape"), value):
                        self.arrays[f"{step}/{replica}/batch/{name}::{part}"] = np.asarray(array)
                else:
                    self.arrays[f"{step}/{replica}/batch/{name}"] = np.asarray(value)

    def save(self, path: Path) -> Path:
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez(tmp, **self.arrays)
        os.replace(tmp, path)
        return path

    @staticmethod
    def load(path: Path):
        losses: dict[int, dict[int, np.ndarray]] = {}
        batches: dict[int, dict[int, dict[str, Any]]] = {}
        with np.load(path) as stored:
            for key in stored.files:
                step, replica, kind, *rest = key.split("/", 3)
                step, replica = int(step), int(replica)
                if kind == LOSS:
                    losses.setdefault(step, {})[replica] = stored[key]
                    continue
                name, _, part = rest[0].partition("::")
                batch = batches.setdefault(step, {}).setdefault(replica, {})
                if not part:
                    batch[name] = stored[key]
                else:
                    parts = batch.setdefault(name, {})
                    parts[part] = stored[key]
        for by_replica in batches.values():
            for batch in by_replica.values():
                for name, value in list(batch.items()):
                    if isinstance(value, dict):
                        batch[name] = (value["indices"], value["values"], value["shape"])
        return losses, batches


def collect_outputs(run_dir: Path, workers: int,
                    wait: float | None = None) -> dict[int, WorkerOutput]:
    """Every worker's output that is there (a worker that died early wrote none). `wait`
    seconds: on real hosts, how long to wait for other hosts' workers to finish writing."""
    deadline = None if wait is None else time.monotonic() + wait
    outputs = {}
    for worker in range(workers):
        directory = output_dir(run_dir, worker)
        marker = directory / "worker.json"
        while deadline is not None and not marker.is_file() and time.monotonic() < deadline:
            time.sleep(0.5)
        if not marker.is_file():
            continue
        doc = json.loads(marker.read_text())
        losses, batches = ({}, {})
        if (directory / "replicas.npz").is_file():
            losses, batches = ReplicaLog.load(directory / "replicas.npz")
        trace = Trace.load(directory / "trace") if (directory / "trace.json").is_file() else None
        outputs[worker] = WorkerOutput(worker, losses, batches,
                                       [(c["path"], int(c["after_step"]))
                                        for c in doc.get("checkpoints", [])],
                                       doc.get("error"), trace)
    return outputs


def join_outputs(trace: Trace, outputs: Mapping[int, WorkerOutput], replicas: int, *,
                 capture_steps: bool = True) -> Trace:
    """Fill `trace` from the workers' outputs: everything the chief (worker 0) recorded but its
    loss and input, which cover its own replicas only; then each step's loss and input from
    every worker's replicas (recorded when all `replicas` sent theirs)."""
    recorder = StepRecorder(trace)
    chief = outputs.get(0)
    if chief is not None and chief.trace is not None:
        recorder.taken_from(chief.trace, skip=(LOSS, INPUT) if capture_steps else ())
        trace.meta.replicas = chief.trace.meta.replicas
        trace.meta.capture_every = chief.trace.meta.capture_every
        trace.meta.details.update(chief.trace.meta.details)
    if capture_steps:
        steps = sorted({s for o in outputs.values() for s in (*o.losses, *o.batches)})
        for step in steps:
            losses = {r: v for o in outputs.values() for r, v in o.losses.get(step, {}).items()}
            batches = {r: v for o in outputs.values() for r, v in o.batches.get(step, {}).items()}
            recorder.replica_step(step, losses, batches, replicas)
    return trace


def shared_checkpoints(outputs: Mapping[int, WorkerOutput],
                       relative_to: Path | None = None) -> list[CheckpointWrite]:
    """Checkpoint paths that more than one worker wrote, earliest first (paths under
    `relative_to` written relative to it, so reports do not hold a temporary directory).

    >>> a = WorkerOutput(0, {}, {}, [("/r/ckpt-1", 20)])
    >>> b = WorkerOutput(1, {}, {}, [("/r/ckpt-1", 20), ("/r/tmp/ckpt-1", 20)])
    >>> shared_checkpoints({0: a, 1: b})
    [CheckpointWrite(path='/r/ckpt-1', after_step=20, workers=(0, 1))]
    """
    writers: dict[str, dict[int, int]] = {}
    for worker, output in outputs.items():
        for path, step in output.checkpoints:
            if relative_to is not None and Path(path).is_relative_to(relative_to):
                path = str(Path(path).relative_to(relative_to))
            writers.setdefault(path, {}).setdefault(worker, step)
    shared = [CheckpointWrite(path, min(by.values()), tuple(sorted(by)))
              for path, by in writers.items() if len(by) > 1]
    return sorted(shared, key=lambda w: (w.after_step, w.path))


def cut_after(trace: Trace, step: int) -> None:
    """Drop what `trace` recorded after `step` (a run judged as if it had stopped there)."""
    StepRecorder(trace).drop_after(step)
