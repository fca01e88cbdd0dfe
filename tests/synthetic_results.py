"""A run of any size built directly as tables, no TensorFlow: the report, HTML, history,
CLI and shard-merge tests judge and render it; `shard_dirs` writes it as shard reports."""
import numpy as np
import pandas as pd

from verify.core.pair_spec import shard_of
from verify.judge.compare import COLUMNS, first_divergence
from verify.judge.pair import LOSS_COLUMNS
from verify.judge.records import PAIR_COLUMNS
from verify.judge.verdict import judge
from verify.render import write_report
from verify.store.history import run_record
from verify.store.results import RunResults

ENVIRONMENT = {"tensorflow": "2.15.1", "numpy": "1.26.4", "python": "3.11.7",
               "cpu": "Test CPU", "platform": "Linux-test", "device": "cpu"}
LONG_REASON = ("Mismatched elements: 3 / 50 (6.0%). Greatest absolute difference: 0.0123 at "
               "index (4, 2) (up to 1e-06 allowed). Greatest relative difference: 0.51 at index "
               "(4, 2) (up to 1e-05 allowed). ") * 3


def synthetic_results(pairs=3, tensors=4, steps=5, failing=1, name_length=10, seed=0,
                      drift_scale=1.0, cases=4) -> RunResults:
    """A run of `pairs` pairs x `tensors` tensors x `steps` steps; the first `failing` pairs
    fail from step 2 on their first tensor's gradient. `drift_scale` multiplies every drift."""
    rng = np.random.default_rng(seed)
    names = [f"layer_{i:04d}/" + "k" * name_length for i in range(tensors)]
    quantities = ["grad", "slot", "weight"]
    frames, records, losses = [], [], []
    for n in range(pairs):
        key = {"case": f"case_{n % cases}", "reference": "tf1", "candidate": f"tf2-variant-{n:03d}",
               "replicas": 1 + n % 2}
        step = np.repeat(np.arange(1, steps + 1), len(quantities) * tensors)
        quantity = np.tile(np.repeat(quantities, tensors), steps)
        tensor = np.tile(names, steps * len(quantities))
        max_abs = 10 ** rng.uniform(-9, -7, step.size) * drift_scale
        passed = np.ones(step.size, bool)
        reason = np.full(step.size, "", object)
        if n < failing:
            bad = (step >= 2) & (tensor == names[0]) & (quantity == "grad")
            max_abs[bad], passed[bad], reason[bad] = 1e-2 * step[bad], False, LONG_REASON
        frame = pd.DataFrame({**key, "step": step, "quantity": quantity, "tensor": tensor,
                              "max_abs": max_abs, "max_rel": max_abs * 10,
                              "rel_l2": max_abs * 2, "atol": 1e-6, "rtol": 1e-5,
                              "tightest_rtol": np.where(passed, 0.0, max_abs),
                              "times_tolerance": max_abs / 1e-6,
                              "worst_index": "(0,)", "passed": passed, "reason": reason,
                              "floor": np.nan, "looseness": np.nan,
                              "status": np.where(passed, "passed", "failed")})
        loss = pd.DataFrame({**key, "step": np.arange(1, steps + 1), "quantity": "loss",
                             "tensor": "loss", "max_abs": 1e-8 * drift_scale, "max_rel": 1e-8,
                             "rel_l2": 1e-8, "atol": 1e-6, "rtol": 1e-5, "tightest_rtol": 0.0,
                             "times_tolerance": 1e-2 * drift_scale,
                             "worst_index": "()", "passed": True, "reason": "",
                             "floor": np.nan, "looseness": np.nan, "status": "passed"})
        frame = pd.concat([loss, frame], ignore_index=True)[COLUMNS]
        verdict = judge(frame, None)
        d = first_divergence(frame)
        records.append({**key, "role": "faithful", "verdict": verdict.status,
                        "first_step": d.step if d else None,
                        "first_quantity": d.quantity if d else "",
                        "first_tensor": d.tensor if d else "", "margin": np.nan,
                        "message": verdict.message, "expected": "", "seed": 7, "steps": steps,
                        "seconds": 1.0,
                        # the explanation stage's longest line, on every failing pair
                        "likely_cause": "gradients x0.5: " + "c" * 184 if n < failing else ""})
        reference = 1.0 / np.arange(1, steps + 1)
        losses.append(pd.DataFrame({**key, "step": np.arange(1, steps + 1), "tensor": "loss",
                                    "reference_loss": reference,
                                    "candidate_loss": reference + (0.05 if n < failing else 0)}))
        frames.append(frame)
    return RunResults(rows=pd.concat(frames, ignore_index=True),
                      pairs=pd.DataFrame(records, columns=PAIR_COLUMNS),
                      losses=pd.concat(losses, ignore_index=True)[LOSS_COLUMNS],
                      environment=dict(ENVIRONMENT),
                      options={"device": "cpu", "steps": steps, "replicas": "1,2"})


def shard_dirs(tmp_path, commit="abc", count=3, options=None):
    """The synthetic run's pairs written as `count` shard report directories."""
    results = synthetic_results(pairs=4, tensors=1, steps=2, failing=1)
    directories = []
    for k in range(1, count + 1):
        keep = [shard_of(f"{p.case}:{p.reference}-vs-{p.candidate}", count) == k
                for p in results.pairs.itertuples()]
        pairs = results.pairs[keep]
        names = set(pairs["candidate"])
        shard = type(results)(rows=results.rows[results.rows["candidate"].isin(names)],
                              pairs=pairs, losses=results.losses[
                                  results.losses["candidate"].isin(names)],
                              environment=results.environment,
                              options={**(options or results.options), "shard": f"{k}/{count}"})
        directory = tmp_path / f"shard{k}"
        write_report(directory, shard, run_record(shard, run_id=f"r{k}",
                                                  provenance={"git_commit": commit}))
        directories.append(directory)
    return results, directories
