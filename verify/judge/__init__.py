"""Judging a pair: drift rows (`compare`), the verdict (`verdict`), the declared-configuration
diff (`preflight`) and which side departs from the math (`attribution`), put together in one
place, `judge_pair`. Nothing here imports TensorFlow.
"""
from verify.judge.pair import PairResult, judge_pair, unjudged

__all__ = ["PairResult", "judge_pair", "unjudged"]
