import pytest


@pytest.fixture(scope="session", autouse=True)
def cpu_replicas():
    """TensorFlow's logical CPU devices, configured once per test process before any test can
    start the runtime (it cannot be split afterwards, whichever test runs first)."""
    from verify.devices import configure_cpu_replicas

    return configure_cpu_replicas()
