"""What every runner kind shares to observe a run, never to replace it: the step taps, table
capture, sensitivity mutations, the declared configuration, devices, process state, the
TensorFlow internals the capture touches, and the TPU transfers (host_call, outside
compilation)."""
