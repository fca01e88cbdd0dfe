"""Environment processes: implementations that run in another environment, asked by name.

An `EnvironmentPool` keeps one process per environment for the life of a session (so one per
pytest process, xdist worker or not, and environment): that environment's Python running
`python -m verify serve`, which imports TensorFlow once and then serves runs. Each request is a
`RunSpec` (case sources, case and implementation by name) and a directory; the environment
process runs the implementation exactly as an in-process run would
(`verify.runners.case_sources.run_spec`), saves the trace there and answers with its path. The
trace carries the environment process's environment.

The protocol is one JSON line per request on the process's stdin and one per answer on a pipe
of its own (its stdout and stderr, where TensorFlow and user code print, go to its log).

An environment process that dies or stops answering is reported as such in the trace of the
run it was doing (with the last lines of its log) and is replaced for the next run; an
environment that cannot be built fails every run that needs it with the reason, once per
session.

>>> pool = EnvironmentPool({}, sources=("cases",))
>>> trace = pool.run(RunSpec(sources=("cases",), case="c", implementation="i"), "nowhere")
>>> print(trace.error)
UnknownEnvironment: implementation i of case c runs in environment 'nowhere', which is not declared; declared: none (declare it under [tool.parity.environments.nowhere] in pyproject.toml)
"""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Mapping

from verify.core.meta import Environment
from verify.core.scratch import make_scratch
from verify.core.trace import Trace
from verify.environments.declared import (DeclaredEnvironment, EnvironmentUnavailable,
                                         UnknownEnvironment, default_cache, ensure)
from verify.core.runner import RunSpec
from verify.runners.worker_group import PARENT, exit_with_parent

# seconds an environment process may take to import TensorFlow and say it is ready
START_TIMEOUT = 600.0
GRACE = 120.0            # seconds beyond a run's own time limit before its process is stopped
LOG_TAIL = 30            # lines of a dead environment process's log quoted in the trace
SUITE_PACKAGE = Path(__file__).resolve().parents[1]   # the verify package itself


class EnvironmentProcessDied(RuntimeError):
    """An environment process exited or stopped answering."""


class EnvironmentProcess:
    """The process that serves the runs of one built environment."""

    def __init__(self, name: str, python: Path, variables: Mapping[str, str],
                 pythonpath: list[str], log_dir: Path):
        self.name, self.python = name, python
        self.variables, self.pythonpath = dict(variables), pythonpath
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"environment-{name}-{os.getpid()}-{time.time_ns()}.log"
        self.process: subprocess.Popen | None = None
        self._answers = None

    def start(self) -> None:
        read_end, write_end = os.pipe()
        env = {**os.environ, **self.variables, "PARITY_ENVIRONMENT": self.name,
               "PARITY_ANSWER_FD": str(write_end), PARENT: str(os.getpid()),
               "PYTHONPATH": os.pathsep.join(self.pythonpath),
               "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
        env.pop("PYTHONHOME", None)
        env.pop("VIRTUAL_ENV", None)
        with open(self.log_path, "ab") as log:
            self.process = subprocess.Popen(
                [str(self.python), "-m", "verify", "serve"], stdin=subprocess.PIPE,
                stdout=log, stderr=subprocess.STDOUT, env=env, pass_fds=(write_end,),
                start_new_session=True)
        os.close(write_end)
        self._answers = os.fdopen(read_end, "r")
        hello = self._answer(START_TIMEOUT, "starting")
        if hello.get("ready") is not True:
            raise EnvironmentProcessDied(f"the process of environment {self.name} did not start: "
                                         f"{hello}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def run(self, spec: RunSpec, out: Path, timeout: float | None,
            grace: float = GRACE) -> Path:
        """Ask for one run; the path of the saved trace. Raises EnvironmentProcessDied. The
        process is stopped when it has not answered `grace` seconds after the run's own time
        limit."""
        if not self.alive():
            self.start()
        request = {"spec": json.loads(spec.to_json()), "out": str(out),
                   "timeout": timeout}
        try:
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            self.process.stdin.flush()
        except OSError as e:
            raise EnvironmentProcessDied(f"the process of environment {self.name} is gone "
                                         f"({e})") from None
        answer = self._answer(timeout + grace if timeout else None,
                              f"running {spec.case}:{spec.implementation}")
        if "error" in answer:
            raise RuntimeError(answer["error"])
        return Path(answer["trace"])

    def _answer(self, timeout: float | None, doing: str) -> dict:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = 1.0 if deadline is None else min(1.0, max(0.0, deadline - time.monotonic()))
            if self._readable(wait):
                line = self._answers.readline()
                if line:
                    return json.loads(line)
                self._stop()
                raise EnvironmentProcessDied(self._death(f"exited while {doing}"))
            if not self.alive():
                raise EnvironmentProcessDied(self._death(f"exited while {doing}"))
            if deadline is not None and time.monotonic() >= deadline:
                self._stop()
                raise EnvironmentProcessDied(self._death(f"stopped answering while {doing} for "
                                             f"{timeout:g} s and was stopped"))

    def _readable(self, wait: float) -> bool:
        """Whether an answer (or the end of the pipe) can be read within `wait` seconds; by
        poll, which, unlike select, takes descriptors above 1023."""
        poller = select.poll()
        poller.register(self._answers, select.POLLIN | select.POLLHUP | select.POLLERR)
        return bool(poller.poll(wait * 1000))

    def _death(self, what: str) -> str:
        code = self.process.poll() if self.process else None
        how = ("" if code is None else f" (killed by signal {-code})" if code < 0
               else f" (exit code {code})")
        return (f"the process of environment {self.name} {what}{how}; the last lines "
                f"of its log {self.log_path}:\n{log_tail(self.log_path)}")

    def _stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, 9)
            except (ProcessLookupError, PermissionError):
                self.process.kill()
        self.process.wait()

    def close(self) -> None:
        """Ask the process to finish, and stop it if it does not; its log is kept only when
        it did not end well."""
        if self.process is None:
            return
        if self.process.poll() is None:
            try:
                self.process.stdin.close()
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self._stop()
        if self._answers is not None:
            self._answers.close()
        if self.process.returncode == 0:   # a process that ended well leaves no log behind
            self.log_path.unlink(missing_ok=True)
        self.process = None


def log_tail(path: Path, lines: int = LOG_TAIL) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    kept = [line for line in text if line.strip()][-lines:]
    return "\n".join(kept) or "(empty log)"


class EnvironmentPool:
    """The session's environment processes: one per environment, built and started on first use."""

    def __init__(self, declared: Mapping[str, DeclaredEnvironment], sources: tuple[str, ...],
                 cache: Path | None = None, progress=None, pythonpath: list[str] | None = None,
                 grace: float = GRACE, device: str = "cpu"):
        self.declared, self.sources = dict(declared), tuple(sources)
        self.device = device
        self.cache = Path(cache) if cache else default_cache()
        self.progress, self.grace = progress, grace
        self.processes: dict[str, EnvironmentProcess] = {}
        self.unavailable: dict[str, str] = {}   # environment -> why it cannot be used
        self.tpu_holder: str | None = None      # the environment whose process ran on the TPU
        self._scratch = make_scratch("environment-processes")
        self.pythonpath = pythonpath or [str(self._suite_only())]

    def _suite_only(self) -> Path:
        """A directory that holds only the verify package (a link to it): what an environment
        process needs on its path. The directory the suite is installed in (site-packages, for a
        wheel) would also put the suite's TensorFlow ahead of the environment's own."""
        directory = self._scratch / "suite"
        directory.mkdir()
        (directory / "verify").symlink_to(SUITE_PACKAGE, target_is_directory=True)
        return directory

    def run(self, spec: RunSpec, environment: str, timeout: float | None = None) -> Trace:
        """The trace of `spec` run in `environment`; a failing trace (never an exception)
        when the environment or its process fails."""
        started = time.perf_counter()
        if spec.device == "tpu":
            self.hand_tpu_to(environment)
        try:
            process = self._process(environment, spec)
            out = self._scratch / f"{spec.case}-{spec.implementation}-{time.time_ns()}"
            try:
                trace = Trace.load(process.run(spec, out, timeout, self.grace))
            except EnvironmentProcessDied as e:
                self.processes.pop(environment, None)
                return self._failed(spec, environment, f"EnvironmentProcessDied: {e}", started)
            finally:
                # a loaded trace holds its npz open where it maps arrays from it: removing
                # the files here frees their space only once the trace is gone (POSIX)
                for leftover in out.parent.glob(out.name + ".*"):
                    leftover.unlink(missing_ok=True)
            seconds = round(time.perf_counter() - started, 3)
            trace.meta.details["environment_process_seconds"] = seconds
            return trace
        except EnvironmentUnavailable as e:
            return self._failed(spec, environment, f"{type(e).__name__}: {e}", started)
        except Exception as e:  # noqa: BLE001 - a failing trace, never a lost session
            return self._failed(spec, environment, f"{type(e).__name__}: {e}", started)

    def hand_tpu_to(self, environment: str | None) -> None:
        """Let `environment`'s process use the TPU (None: none of them): on a TPU VM one process
        at a time may hold it (libtpu's lock) and a process keeps it until it exits, so the
        process of another environment that ran on it is stopped first."""
        holder = self.tpu_holder
        if holder is not None and holder != environment and holder in self.processes:
            self.processes.pop(holder).close()
        self.tpu_holder = environment

    def _process(self, environment: str, spec: RunSpec) -> EnvironmentProcess:
        if environment in self.unavailable:
            raise EnvironmentUnavailable(self.unavailable[environment])
        process = self.processes.get(environment)
        if process is not None and process.alive():
            return process
        declared = self.declared.get(environment)
        if declared is None:
            known = ", ".join(sorted(self.declared)) or "none"
            raise UnknownEnvironment(
                f"implementation {spec.implementation} of case {spec.case} runs in environment "
                f"{environment!r}, which is not declared; declared: {known} (declare it under "
                f"[tool.parity.environments.{environment}] in pyproject.toml)")
        try:
            built = ensure(declared, self.cache, self.progress)
            process = EnvironmentProcess(environment, built.python,
                                       {**self.device_variables(), **declared.variables},
                                       self.pythonpath + self._source_paths(),
                                       self.cache / "logs")
            process.start()
        except (EnvironmentUnavailable, EnvironmentProcessDied) as e:
            self.unavailable[environment] = str(e)
            raise EnvironmentUnavailable(str(e)) from None
        self.processes[environment] = process
        return process

    def device_variables(self) -> dict[str, str]:
        """What an environment process is told of the session's device: on CPU, JAX is kept off
        any TPU the machine has (`JAX_PLATFORMS=cpu`: JAX would otherwise take it, and with it
        libtpu's lock, while the run is recorded as a CPU run), unless the user set it.

        >>> EnvironmentPool({}, sources=()).device_variables()
        {'JAX_PLATFORMS': 'cpu'}
        """
        if self.device == "cpu" and "JAX_PLATFORMS" not in os.environ:
            return {"JAX_PLATFORMS": "cpu"}
        return {}

    def _source_paths(self) -> list[str]:
        """Directories an environment process needs on its path to import the case sources by
        name."""
        paths = []
        for source in self.sources:
            path = Path(source)
            if path.exists():
                paths.append(str(path.resolve().parent))
        return paths

    def _failed(self, spec: RunSpec, environment: str, error: str, started: float) -> Trace:
        trace = Trace(spec.implementation, {"case": spec.case, "implementation":
                                            spec.implementation, "steps": spec.steps},
                      error=error)
        trace.meta.environment = Environment(name=environment)
        trace.meta.seconds = round(time.perf_counter() - started, 3)
        return trace

    def close(self) -> None:
        for process in self.processes.values():
            process.close()
        self.processes.clear()
        import shutil

        shutil.rmtree(self._scratch, ignore_errors=True)


def serve() -> int:
    """The environment process's side (`python -m verify serve`): answer run requests until
    stdin ends."""
    answers = os.fdopen(int(os.environ["PARITY_ANSWER_FD"]), "w")
    # a run killed (SIGKILL, a CI job's end) leaves no environment process training on
    exit_with_parent()
    from verify.runners.case_sources import run_spec

    def answer(doc: dict) -> None:
        answers.write(json.dumps(doc) + "\n")
        answers.flush()

    answer({"ready": True, "pid": os.getpid(), "python": sys.version.split()[0]})
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            spec = RunSpec.from_json(json.dumps(request["spec"]))
            trace = run_spec(spec, timeout=request.get("timeout"))
            answer({"trace": str(trace.save(request["out"], compress=False))})
        except Exception as e:  # noqa: BLE001 - the parent turns it into a failing trace
            answer({"error": f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=8)}"})
    return 0
