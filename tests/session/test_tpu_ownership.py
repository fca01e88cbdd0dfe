"""On a TPU VM one process at a time may hold the TPU: a `--tpu` session runs the
implementations of other environments first (their processes holding the TPU in turn), and only
then takes the TPU for its own runs; a TPU that does not answer fails every run before any
environment process starts. The resolver and the environment processes are stand-ins here."""
import numpy as np
import pytest

from verify.core.case import Case, Examples, Implementation, PairSpec, SuiteOptions
from verify.core.names import NameMap
from verify.core.trace import Trace
from verify.environments.pool import EnvironmentPool
from verify.runners.capture import devices
from verify.session.trace_supply import TraceSupply


def _case() -> Case:
    sides = tuple(Implementation(name, None, NameMap({}), environment=environment)
                  for name, environment in (("tf1", "local"), ("keras3-jax", "keras3-jax"),
                                            ("keras3-tf", "keras3-tf"), ("tf2", "local")))
    return Case("owned", Examples({"x": np.zeros((2, 1))}, labels=np.zeros(2)), 2, 1, {}, sides,
                "tf1")


PAIRS = [PairSpec("owned", "tf1", "keras3-jax"), PairSpec("owned", "tf1", "keras3-tf"),
         PairSpec("owned", "keras3-jax", "keras3-tf"), PairSpec("owned", "tf1", "tf2")]


class _Pool:
    def __init__(self, events):
        self.events = events

    def hand_tpu_to(self, environment):
        self.events.append(("hand_tpu_to", environment))


@pytest.fixture
def session(monkeypatch):
    """A TPU session's trace supply whose resolver, child probe and environment processes record
    what they are asked, in order."""
    events = []

    def run_elsewhere(cache, case, implementation):
        events.append(("environment process", implementation.name))
        cache._pool = _Pool(events)
        return Trace(implementation.name)

    def run_here(case, implementation, **kwargs):
        events.append(("here", implementation.name))
        return Trace(implementation.name)

    monkeypatch.setattr(devices, "probe_tpu_in_child", lambda name: events.append(
        ("child probe", name)) or None)
    monkeypatch.setattr(devices, "resolve_tpu", lambda name: events.append(("resolve", name)))
    monkeypatch.setattr(TraceSupply, "_run_elsewhere", run_elsewhere)
    import verify.runners.run as run

    monkeypatch.setattr(run, "run_implementation", run_here)
    return events


def _cache(pairs=PAIRS, **kwargs) -> TraceSupply:
    return TraceSupply(SuiteOptions(device="tpu", tpu_name="v5e"), judged=lambda: pairs,
                      notes=[], **kwargs)


def test_other_environments_run_first_then_this_process_takes_the_tpu(session):
    case = _case()
    cache = _cache()
    cache.probe_tpu({"owned": case})
    assert session == [("child probe", "v5e"), ("environment process", "keras3-jax"),
                       ("environment process", "keras3-tf"), ("hand_tpu_to", None),
                       ("resolve", "v5e")]
    cache.probe_tpu({"owned": case})                  # once per session
    cache.trace(case, "keras3-tf")                    # already run: not again
    cache.trace(case, "tf1")
    assert session[5:] == [("here", "tf1")]
    assert cache.tpu_error is None


def test_a_session_without_other_environments_takes_the_tpu_at_once(session):
    cache = _cache([PairSpec("owned", "tf1", "tf2")])
    cache.probe_tpu({"owned": _case()})
    assert session == [("resolve", "v5e")]            # no child probe, no environment process


def test_a_tpu_that_does_not_answer_fails_every_run_before_any_environment_process(session, monkeypatch):
    monkeypatch.setattr(devices, "probe_tpu_in_child", lambda name: "no TPU is reachable (x)")
    case = _case()
    cache = _cache()
    cache.probe_tpu({"owned": case})
    assert cache.tpu_error == "no TPU is reachable (x)"
    assert session == []                              # nothing ran, this process took nothing
    assert cache.trace(case, "keras3-jax").error == "no TPU is reachable (x)"
    assert session == []


def test_a_golden_reference_is_not_run_first(session, tmp_path):
    """With --golden only candidates run: keras3-jax, a reference here, comes from the golden."""
    cache = _cache([PairSpec("owned", "keras3-jax", "keras3-tf")], golden=tmp_path)
    cache.probe_tpu({"owned": _case()})
    assert ("environment process", "keras3-jax") not in session
    assert session[:2] == [("child probe", "v5e"), ("environment process", "keras3-tf")]


def test_a_cpu_session_probes_nothing(session):
    cache = TraceSupply(SuiteOptions(), judged=lambda: PAIRS, notes=[])
    cache.probe_tpu({"owned": _case()})
    assert session == [] and cache.tpu_error is None


class _EnvironmentProcess:
    def __init__(self):
        self.closed = False

    def close(self):
        self.closed = True


def test_the_pool_stops_the_process_holding_the_tpu_before_another_takes_it():
    pool = EnvironmentPool({}, sources=())
    jax_process, tf_process = _EnvironmentProcess(), _EnvironmentProcess()
    pool.processes = {"keras3-jax": jax_process, "keras3-tf": tf_process}
    pool.hand_tpu_to("keras3-jax")
    pool.hand_tpu_to("keras3-jax")                    # the same environment keeps its process
    assert not jax_process.closed and pool.tpu_holder == "keras3-jax"
    pool.hand_tpu_to("keras3-tf")
    assert jax_process.closed and "keras3-jax" not in pool.processes
    assert not tf_process.closed and pool.tpu_holder == "keras3-tf"
    pool.hand_tpu_to(None)                            # this process takes it
    assert tf_process.closed and pool.processes == {}
    pool.close()


def test_a_cpu_sessions_environment_processes_keep_jax_off_the_tpu(monkeypatch):
    """On a TPU VM a CPU session's keras3-jax process must not take the TPU (and libtpu's lock)
    while its run is recorded as a CPU run; a TPU session, or a user's own JAX_PLATFORMS,
    decides for itself."""
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    assert EnvironmentPool({}, sources=()).device_variables() == {"JAX_PLATFORMS": "cpu"}
    assert EnvironmentPool({}, sources=(), device="tpu").device_variables() == {}
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    assert EnvironmentPool({}, sources=()).device_variables() == {}
