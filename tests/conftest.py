import pytest


@pytest.fixture(scope="session")
def cpu_replicas():
    """TensorFlow with the suite's logical CPU devices (configured before the runtime starts)."""
    from verify.devices import configure_cpu_replicas

    return configure_cpu_replicas()
