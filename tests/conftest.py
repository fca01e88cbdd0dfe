import pytest


@pytest.fixture(scope="session")
def tf_devices():
    """TensorFlow's logical CPU devices, configured once per test process before any test can
    start the runtime (it cannot be split afterwards, whichever test runs first)."""
    from verify.runners.capture.devices import configure_cpu_replicas

    return configure_cpu_replicas()


@pytest.fixture(autouse=True)
def cpu_replicas(request):
    """Configure the devices before every test that uses TensorFlow (marked `slow`); tests that
    need no TensorFlow never import it."""
    if request.node.get_closest_marker("slow") is not None:
        return request.getfixturevalue("tf_devices")
    return None
