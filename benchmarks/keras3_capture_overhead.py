"""Capture overhead on the Keras 3 destination: the keras-rs rewrite's run time captured every
step / the same steps uncaptured (variables read after every step), per backend.

Target: <= 1.3x, as for the TF2 runners (benchmarks/capture_overhead.py). Prints ratios
measured in this run. Runs itself in each keras3 environment (built on first use):

    python benchmarks/keras3_capture_overhead.py [--steps 200] [--repeats 3]
"""
import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TARGET = 1.3

from capture_overhead import timed  # noqa: E402 - the same median-of-runs timing


def inside(environment: str, steps: int, repeats: int) -> None:
    """Measure in this process (a keras3 environment)."""
    from cases.recommender import make_case
    from cases.tpu_embedding import CASE

    for case in (CASE, make_case("adam")):
        implementation = case.implementation(environment)
        timed(case, implementation, 5, True, 1)    # warm-up: the first compilations
        on = timed(case, implementation, steps, True, repeats)
        off = timed(case, implementation, steps, False, repeats)
        verdict = "ok" if on / off <= TARGET else f"above the {TARGET}x target"
        print(f"  {environment} {case.name}: {on / off:.2f}x ({verdict})", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--inside", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        inside(args.inside, args.steps, args.repeats)
        return
    from verify.environments.declared import declared_environments, ensure

    declared = declared_environments(ROOT / "pyproject.toml")
    print(f"Keras 3 capture overhead over {args.steps} steps, median of {args.repeats} runs each")
    for name in ("keras3-jax", "keras3-tf"):
        environment = declared[name]
        python = ensure(environment).python
        env = {**os.environ, **environment.variables, "PYTHONPATH": str(ROOT),
               "PARITY_ENVIRONMENT": name, "TF_CPP_MIN_LOG_LEVEL": "2"}
        subprocess.run([str(python), __file__, "--inside", name, "--steps", str(args.steps),
                        "--repeats", str(args.repeats)], env=env, check=True,
                       stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main()
