"""Preflight: compare what two implementations declare, before (and apart from) training.

Each runner reads its implementation's static configuration into a flat dict of plain values
(`verify.runners.capture.static_config`): tables, combiners, initializers, optimizers and their
hyperparameters, batch size, shuffling, `steps_per_execution`/`iterations_per_loop`, loss
reduction. This module diffs two such dicts, and also checks each side alone, and classes every
finding by a fixed rule:

- **blocking**: it changes the numbers a training run produces on some device the migration
  targets, whether or not this CPU run can see it. This includes differences the numeric
  comparison cannot see by construction: initializers (the suite loads identical initial
  values) and the embedding optimizer (on CPU the tables are trained by the model_fn/compile
  optimizer; on a TPU by the embedding optimizer).
- **informational**: it changes speed or bookkeeping only (`steps_per_execution` against
  `iterations_per_loop`), a value one side does not expose, or a documented API difference
  whose effect is below float32 noise (a Keras legacy optimizer's epsilon of 1e-7 where the TF1
  optimizer has no epsilon term: with accumulators >= 0.1 it moves an update by < 3.2e-7
  relative).

Nothing here imports TensorFlow.
"""
from __future__ import annotations

import fnmatch
import math
from typing import Any, Mapping

import pandas as pd

BLOCKING, INFORMATIONAL = "blocking", "informational"
COLUMNS = ["case", "reference", "candidate", "side", "key", "reference_value",
           "candidate_value", "severity", "rule"]
NOT_EXPOSED = "not exposed"

# (key pattern, severity, why) - the first matching pattern decides.
RULES: list[tuple[str, str, str]] = [
    ("loop/steps_per_call", INFORMATIONAL, "how many steps run per host call: speed only"),
    ("loop/reduce_op", BLOCKING,
     "how the replicas' results are combined: MEAN divides what SUM adds by the replica "
     "count, so every gradient (or the reported loss) is scaled"),
    ("loss/scaling", BLOCKING,
     "what the per-example loss is divided by: another divisor scales every gradient (or "
     "only the last, partial batch's)"),
    ("loop/clip_*", BLOCKING, "which gradients are clipped, and to what norm"),
    ("loop/train_loss_tracking", BLOCKING, "how the training loss the loop reports is formed"),
    ("optimizer/*/epsilon", INFORMATIONAL,
     "TF1 optimizers have no epsilon term where Keras ones add at least 1e-7; with "
     "accumulators >= 0.1 that moves an update by < 3.2e-7 relative (legacy Keras: "
     "sqrt(acc) + eps) or < 5e-7 (Keras 3: sqrt(acc + eps))"),
    ("table/*/initializer", BLOCKING,
     "the suite loads identical initial values, so the comparison cannot see this; a "
     "production run starts from different tables"),
    ("optimizer/embedding/*", BLOCKING,
     "trains the tables on a TPU; invisible on CPU, where the model/compile optimizer does"),
    ("*", BLOCKING, "changes the numbers trained"),
]


ON_TPU_EMBEDDING = ("on a TPU this optimizer trains the tables inside the embedding engine "
                    "(TF1: EmbeddingConfigSpec.optimization_parameters; TF2: the TPUEmbedding "
                    "layer's optimizer): it changes the tables this run reads back")


def rule_for(key: str, reference: Any, candidate: Any, device: str = "cpu") -> tuple[str, str]:
    """Severity and reason for a difference at `key` in a run on `device`. On a TPU every
    embedding-optimizer difference is blocking, epsilon included: the engine's math runs.

    >>> rule_for("loop/steps_per_call", "iterations_per_loop=10", "steps_per_execution=1")[0]
    'informational'
    >>> rule_for("loop/reduce_op", "SUM", "MEAN")[0]
    'blocking'
    >>> rule_for("table/embedding/user/combiner", "mean", "sum")[0]
    'blocking'
    >>> rule_for("optimizer/model/epsilon", None, 1e-7)[0]
    'informational'
    >>> rule_for("optimizer/model/epsilon", 1e-8, 1e-7)[0]
    'blocking'
    >>> rule_for("optimizer/embedding/clip_weight_max", "none", 1.0, device="tpu")[1][:8]
    'on a TPU'
    """
    if NOT_EXPOSED in (reference, candidate):
        return INFORMATIONAL, "one side does not expose this value; check it by hand"
    if device == "tpu" and key.startswith("optimizer/embedding/"):
        return BLOCKING, ON_TPU_EMBEDDING
    for pattern, severity, why in RULES:
        if fnmatch.fnmatchcase(key, pattern):
            if pattern.endswith("/epsilon") and not _benign_epsilon(reference, candidate):
                continue
            return severity, why
    raise AssertionError("the catch-all rule always matches")


def _benign_epsilon(a: Any, b: Any) -> bool:
    """One side has no epsilon term and the other has Keras' minimum 1e-7 or less."""
    present = [v for v in (a, b) if not (v is None or str(v).startswith("none"))]
    return len(present) == 1 and isinstance(present[0], float) and present[0] <= 1e-7


def same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6, abs_tol=0.0)
    return a == b


def diff_configs(reference: Mapping[str, Any], candidate: Mapping[str, Any],
                 device: str = "cpu") -> list[dict]:
    """Differences between two static configurations, each with a severity and a reason.

    >>> rows = diff_configs({"data/global_batch_size": 8, "table/t/combiner": "mean"},
    ...                     {"data/global_batch_size": 8, "table/t/combiner": "sum"})
    >>> [(r["key"], r["severity"]) for r in rows]
    [('table/t/combiner', 'blocking')]
    """
    rows = []
    for key in sorted(set(reference) | set(candidate)):
        a, b = reference.get(key, NOT_EXPOSED), candidate.get(key, NOT_EXPOSED)
        if not same(a, b):
            severity, why = rule_for(key, a, b, device)
            rows.append({"side": "both", "key": key, "reference_value": a,
                         "candidate_value": b, "severity": severity, "rule": why})
    return rows


def check_alone(config: Mapping[str, Any], device: str = "cpu") -> list[dict]:
    """Findings about one implementation by itself: an unseeded shuffle, an embedding
    optimizer the TPU engine cannot run as declared (keras-rs), and an embedding optimizer
    that differs from the optimizer that trains everything else (blocking on CPU, which
    cannot vouch for it; informational on a TPU, which ran both).

    >>> [r["key"] for r in check_alone({"data/shuffle": "unseeded"})]
    ['data/shuffle']
    >>> check_alone({"preflight/error": "ValueError: no model"})[0]["severity"]
    'blocking'
    >>> check_alone({"optimizer/embedding/unsupported": "epsilon"})[0]["severity"]
    'blocking'
    """
    rows = []
    if "preflight/error" in config:
        rows.append({"key": "preflight/error", "value": config["preflight/error"],
                     "severity": BLOCKING,
                     "rule": "the configuration could not be read, so nothing was checked"})
    for key in sorted(k for k in config if k.startswith("optimizer/embedding")
                      and k.endswith("/unsupported")):
        rows.append({"key": key, "value": config[key], "severity": BLOCKING,
                     "rule": "the embedding optimizer cannot train the tables on a TPU as "
                             "declared: the TPU run fails or trains with other values"})
    if config.get("data/shuffle") == "unseeded":
        rows.append({"key": "data/shuffle", "value": "unseeded", "severity": BLOCKING,
                     "rule": "an unseeded shuffle feeds a different order on every run"})
    embedding = {k.split("/", 2)[2]: v for k, v in config.items()
                 if k.startswith("optimizer/embedding/")}
    model = {k.split("/", 2)[2]: v for k, v in config.items() if k.startswith("optimizer/model/")}
    if embedding and model:
        for name in sorted(set(embedding) & set(model)):
            if not same(embedding[name], model[name]):
                benign = name == "epsilon" and _benign_epsilon(embedding[name], model[name])
                rows.append({"key": f"optimizer/embedding/{name}", "value":
                             f"embedding {embedding[name]!r} vs model {model[name]!r}",
                             "severity": INFORMATIONAL if benign or device == "tpu"
                             else BLOCKING,
                             "rule": (rule_for("optimizer/model/epsilon", embedding[name],
                                               model[name])[1] if benign else
                                      "on a TPU the embedding optimizer trains the tables and "
                                      "the model optimizer the rest: this TPU run exercised "
                                      "both" if device == "tpu" else
                                      "the tables train with the embedding optimizer on a TPU "
                                      "and with the model optimizer on CPU: this CPU run "
                                      "cannot vouch for the TPU")})
    return rows


def preflight(case: str, reference_name: str, reference: Mapping[str, Any],
              candidate_name: str, candidate: Mapping[str, Any],
              device: str = "cpu") -> pd.DataFrame:
    """All preflight findings for one pair run on `device`, as rows with `COLUMNS`."""
    rows = [{**r, "case": case, "reference": reference_name, "candidate": candidate_name}
            for r in diff_configs(reference, candidate, device)]
    for side, name, config in (("reference", reference_name, reference),
                               ("candidate", candidate_name, candidate)):
        for r in check_alone(config, device):
            rows.append({"case": case, "reference": reference_name, "candidate": candidate_name,
                         "side": side, "key": r["key"],
                         "reference_value": r["value"] if side == "reference" else "",
                         "candidate_value": r["value"] if side == "candidate" else "",
                         "severity": r["severity"], "rule": r["rule"]})
    frame = pd.DataFrame(rows, columns=COLUMNS)
    return frame.astype({c: str for c in ("reference_value", "candidate_value")})


def blocking(findings: pd.DataFrame) -> pd.DataFrame:
    return findings[findings["severity"] == BLOCKING]


def tables_trained_by(implementation: str, config: Mapping[str, Any], device: str) -> str:
    """Which declared optimizer trains the embedding tables on `device`, in words.

    On a TPU the embedding engine applies the embedding optimizer; anywhere else the tables are
    ordinary variables updated by the model_fn/compile optimizer.

    >>> tables_trained_by("tf2", {"optimizer/model/kind": "adagrad",
    ...     "optimizer/model/learning_rate": 0.05, "optimizer/embedding/kind": "sgd"}, "cpu")
    'tf2: adagrad(learning_rate=0.05), the model_fn/compile optimizer, on cpu'
    """
    role = "embedding" if device == "tpu" else "model"
    prefix = f"optimizer/{role}/"
    found = {k[len(prefix):]: v for k, v in config.items()
             if k.startswith(prefix) and k.count("/") == 2}
    if "kind" not in found:
        return f"{implementation}: not declared"
    params = ", ".join(f"{k}={v}" for k, v in sorted(found.items())
                       if k in ("learning_rate", "initial_accumulator_value", "epsilon", "beta")
                       and not str(v).startswith("none"))
    who = ("the embedding optimizer (TPU embedding engine)" if role == "embedding"
           else "the model_fn/compile optimizer")
    return f"{implementation}: {found['kind']}({params}), {who}, on {device}"
