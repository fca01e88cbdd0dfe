"""Judging a pair: drift rows (`compare`, typed in `records`), the verdict (`verdict`), the
declared-configuration diff (`preflight`) and which side departs from the math
(`attribution`), put together in one place, `judge_pair`. Nothing here imports TensorFlow.
"""
from verify.judge.pair import PairResult, judge_pair, unjudged
from verify.judge.records import DriftRow, PairRecord, Status

__all__ = ["DriftRow", "PairRecord", "PairResult", "Status", "judge_pair", "unjudged"]
