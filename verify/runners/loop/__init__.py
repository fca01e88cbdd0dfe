"""Custom training loops: the user's loop under a strategy (`runner`), on several worker
processes (`multi_worker`, `worker`: the process each runs) and where they are (`cluster`)."""
