"""Custom training loops: the user's loop under a strategy (`runner`), on several worker
processes (`multi_worker`, `worker`: the process each runs; `worker_startup`, `worker_outputs`:
how they start and what they write) and where they are (`cluster`)."""
