"""What a session keeps on disk, and reading it back: never imports TensorFlow or a runner.

- `results` (`RunResults`: the report's tables, one part per judged pair),
  `report_dir` (the report directory's lock and files), `shard_merge` (shards into one report);
- `history` (run records and comparing runs), `golden` (golden reference traces),
  `kept_traces` (`--keep-traces`: a report's traces judged again later),
  `tolerance_documents` (tolerances as JSON).
"""
