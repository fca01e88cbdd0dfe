"""`python -m verify init`: a case package for a migration, scaffolded from its entry points.

Each side is given by the functions the user already has: a TF1 `model_fn` and `input_fn`
(`EstimatorRunner`), a Keras model builder and dataset function (`KerasRunner`), or a custom
loop builder (`LoopRunner`: a one-device reference and a two-replica `MirroredStrategy`
candidate). With the data (`--examples`, a function returning `verify.Examples`) each side is
built once without training (`Runner.native_variables`): the reference's variables (trainable
or not: BatchNormalization's moving statistics too) become the canonical names and shapes, the initial values are drawn from a seeded generator
for those shapes, and every other side's name map is inferred (`verify.tools.name_proposals`), its
guesses and what it could not decide marked in the written code.

The package is written whole or not at all: into a temporary directory first, then moved
into place; an existing directory is never overwritten.

>>> side = Side.parse("tf1", ["pipeline.tf1:model_fn", "pipeline.tf1:input_fn"])
>>> side.name, side.runner_code()
('tf1', 'EstimatorRunner(model_fn=tf1_model_fn, input_fn=tf1_input_fn)')
"""
from __future__ import annotations

import ast
import dataclasses
import importlib
import importlib.util
import inspect
import keyword
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from verify.tools.name_proposals import Proposal, propose

# kind -> (implementation name(s), the runner's fields the entry points fill, in order)
KINDS = {"tf1": ("tf1", ("model_fn", "input_fn", "embedding_config_spec")),
         "keras": ("tf2", ("build_model", "dataset_fn")),
         "loop": ("loop", ("build_loop",))}
RUNNERS = {"tf1": "EstimatorRunner", "keras": "KerasRunner", "loop": "LoopRunner"}
ENTRY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class ScaffoldError(ValueError):
    """Bad input to `init`: what is wrong and what to do."""


@dataclasses.dataclass(frozen=True)
class Side:
    """One implementation to scaffold: its name, kind, entry points ("module:function", in the
    order of `KINDS`), the runner's extra fields and its replicas."""

    name: str
    kind: str
    entries: tuple[str, ...]
    fields: tuple[tuple[str, str], ...] = ()    # (field, Python literal)
    replicas: int = 1

    @classmethod
    def parse(cls, kind: str, entries: list[str], **kwargs) -> "Side":
        name, wanted = KINDS[kind]
        required = 2 if kind == "tf1" else len(wanted)
        if not required <= len(entries) <= len(wanted):
            raise ScaffoldError(f"--{kind} takes {' '.join(w.upper() for w in wanted)} "
                                f"(module:function each"
                                + (", the last optional" if kind == "tf1" else "")
                                + f"), got {len(entries)}: {' '.join(entries)}")
        for entry in entries:
            check_entry(f"--{kind}", entry, f"my_pipeline.train:{wanted[0]}")
        return cls(kwargs.pop("name", name), kind, tuple(entries), **kwargs)

    def aliases(self) -> list[tuple[str, str, str]]:
        """(module, function, alias) per entry point; the alias names the side and the field."""
        _, wanted = KINDS[self.kind]
        return [(*entry.split(":"), f"{self.kind}_{field}")
                for entry, field in zip(self.entries, wanted)]

    def runner_code(self) -> str:
        _, wanted = KINDS[self.kind]
        args = [f"{field}={alias}" for (_, _, alias), field in zip(self.aliases(), wanted)]
        args += [f"{field}={value}" for field, value in self.fields]
        return f"{RUNNERS[self.kind]}({', '.join(args)})"

    def build_runner(self) -> Any:
        """The runner, with the entry points imported (what the written case will run)."""
        import verify

        _, wanted = KINDS[self.kind]
        kwargs = {field: _load(entry) for entry, field in zip(self.entries, wanted)}
        kwargs.update({field: ast.literal_eval(value) for field, value in self.fields})
        return getattr(verify, RUNNERS[self.kind])(**kwargs)


def sides_of(tf1: list[str] | None, keras: list[str] | None,
             loop: list[str] | None) -> list[Side]:
    """The sides the options give, the reference first: TF1, else Keras, else the loop's
    one-device run (a loop alone gives its reference and a 2-replica mirrored candidate)."""
    sides = []
    if tf1:
        sides.append(Side.parse("tf1", tf1))
    if keras:
        sides.append(Side.parse("keras", keras))
    if loop:
        sides.append(Side.parse("loop", loop, name="reference-x1",
                                fields=(("strategy", "'default'"),)))
        sides.append(Side.parse("loop", loop, name="mirrored-x2", replicas=2))
    if len(sides) < 2:
        raise ScaffoldError("a migration has two sides: give --tf1 and --keras, or --loop (its "
                            "one-device run against two replicas), or --tf1/--keras with --loop")
    return sides


def check_entry(option: str, entry: str, example: str = "my_pipeline.data:examples") -> None:
    """Refuse an entry point that is not `module:function`, naming the option.

    >>> check_entry("--examples", "pipeline.examples")
    Traceback (most recent call last):
    ...
    verify.tools.case_scaffold.ScaffoldError: --examples: 'pipeline.examples' is not module:function (e.g. my_pipeline.data:examples)
    """
    if not ENTRY.match(entry):
        raise ScaffoldError(f"{option}: {entry!r} is not module:function (e.g. {example})")


def _load(entry: str) -> Callable:
    """The function an entry point names; a ScaffoldError when its module does not import
    or it names nothing callable (an exception the module raises on import is the user's)."""
    from verify.core.user_code import entry_point

    module, function = entry.split(":")
    try:
        with entry_point(entry):
            loaded = importlib.import_module(module)
    except ModuleNotFoundError as e:
        raise ScaffoldError(f"cannot import {entry} ({type(e).__name__}: {e}); run from where "
                            f"the module imports (or set PYTHONPATH)") from None
    value = getattr(loaded, function, None)
    if not callable(value):
        raise ScaffoldError(f"{entry}: {module} has no function {function!r} ("
                            + ("it is not defined" if value is None else
                               f"it is {type(value).__name__}, not callable") + ")")
    return value


@dataclasses.dataclass(frozen=True)
class Inferred:
    """What building the sides found: the canonical shapes (the reference's variables) and,
    per other side, its proposed name map."""

    shapes: dict[str, tuple]
    proposals: dict[str, Proposal]


def infer(sides: list[Side], examples_entry: str, batch_size: int) -> Inferred:
    """Build every side once, without training, on the case's data; the reference's variables
    (trainable or not) are the canonical names."""
    from verify.core.case import Case, Examples, Implementation
    from verify.core.names import NameMap

    from verify.core.user_code import entry_point

    with entry_point(f"--examples {examples_entry}"):
        examples = _load(examples_entry)()
    if not isinstance(examples, Examples):
        raise ScaffoldError(f"--examples {examples_entry} returned {type(examples).__name__}, "
                            f"not verify.Examples")
    if len(examples) == 0:
        raise ScaffoldError(f"--examples {examples_entry} returned 0 examples: a case trains "
                            f"on at least one batch")
    built, native = [], {}
    for side in sides:
        with entry_point(f"--{side.kind} {' '.join(side.entries)}"):
            built.append(Implementation(side.name, side.build_runner(), NameMap({}),
                                        replicas=side.replicas))
    case = Case("scaffold", examples, batch_size, 1, {}, tuple(built), sides[0].name)
    for side, implementation in zip(sides, built):
        with entry_point(f"--{side.kind} {' '.join(side.entries)}"):
            native[side.name] = implementation.runner.native_variables(case, implementation)
    shapes = {name: tuple(shape) for name, (shape, _) in native[sides[0].name].items()}
    if not shapes:
        raise ScaffoldError(f"{sides[0].name} has no trainable variable: is it the reference?")
    return Inferred(shapes, {side.name: propose(native[side.name], shapes)
                             for side in sides[1:]})


# The generated initial_values(): one seeded draw per variable, and BatchNormalization's
# moving statistics as the layer starts them.
INITIAL_VALUES_CODE = [
    "def initial_values():",
    '    """The values every side starts from: one seeded draw per variable (float32), and',
    "    BatchNormalization's moving statistics as the layer starts them (mean 0, variance 1).",
    '    The suite loads them into each side; preflight compares the initializers apart."""',
    "    rng = np.random.default_rng(SEED)",
    "    values = {name: (rng.standard_normal(shape) * 0.05).astype(np.float32)",
    "              for name, shape in SHAPES.items()}",
    "    for name, shape in SHAPES.items():",
    "        if name.endswith(('moving_mean', 'moving_variance')):",
    "            values[name] = np.full(shape, name.endswith('variance'), np.float32)",
    "    return values", "", ""]


def case_code(name: str, sides: list[Side], examples_entry: str, inferred: Inferred,
              batch_size: int, steps: int, seed: int = 0) -> str:
    """The case package's `__init__.py`."""
    reference = sides[0].name
    others = ", ".join(side.name for side in sides[1:])
    imports: dict[tuple[str, str], str] = {}
    for side in sides:
        for module, function, alias in side.aliases():
            imports.setdefault((module, function), alias)
    module, function = examples_entry.split(":")
    imports.setdefault((module, function), "make_examples")
    examples_alias = imports[(module, function)]
    lines = [f'"""{name}: {reference} (the reference) against {others}, scaffolded by '
             f'`python -m verify init`.', "",
             "Check each name map line marked \"check it\" and list what is marked undecided",
             f"(`python -m verify names {name}` prints every side's variables and the map it",
             "infers again), measure the noise floors (`python -m verify calibrate " + name,
             "--cases DIR --out DIR/" + name + "/calibration.json`, DIR the directory holding",
             "this package), then run `python -m verify suite --cases DIR`.", '"""',
             "from pathlib import Path", "", "import numpy as np", "",
             f"from verify import {', '.join(_verify_names(sides, inferred))}"]
    lines += [f"from {m} import {f} as {a}" if f != a else f"from {m} import {f}"
              for (m, f), a in imports.items()]
    lines += ["", f"SEED = {seed}", f"BATCH_SIZE = {batch_size}", f"STEPS = {steps}",
              'CALIBRATION = Path(__file__).with_name("calibration.json")   # once measured',
              f"# canonical name -> shape: the variables of {reference}, whose names "
              f"are the canonical ones", "SHAPES = {"]
    lines += [f"    {n!r}: {tuple(s)!r}," for n, s in inferred.shapes.items()]
    lines += ["}", "", ""] + INITIAL_VALUES_CODE
    lines += [f"{_constant(reference)}_NAMES = NameMap({{"]
    lines += [f"    {n!r}: {n!r}," for n in inferred.shapes]
    lines += ["})"]
    for side in sides[1:]:
        code = inferred.proposals[side.name].name_map_code()
        lines += [f"{_constant(side.name)}_NAMES = {code}"]
    lines += ["", "", "CASE = Case(", f"    name={name!r},",
              f"    examples={examples_alias}(),", "    batch_size=BATCH_SIZE,",
              "    steps=STEPS,", "    initial_values=initial_values(),",
              f"    reference={reference!r},",
              "    calibration_file=CALIBRATION if CALIBRATION.is_file() else None,",
              "    implementations=("]
    for side in sides:
        replicas = f", replicas={side.replicas}" if side.replicas != 1 else ""
        lines.append(f"        Implementation({side.name!r}, {side.runner_code()},")
        lines.append(f"                       {_constant(side.name)}_NAMES{replicas}),")
    variant = pow_adam_variant(sides)
    lines += variant[:2] + ["    ),"] + variant[2:] + [")", ""]
    if variant:
        lines.insert(lines.index("from pathlib import Path") + 5,
                     "from verify.runners.tf1.adam_variants import with_pow_adam")
    return "\n".join(lines)


POW_ADAM = "tf1-pow-bias-correction"


def pow_adam_variant(sides: list[Side]) -> list[str]:
    """The lines declaring TF1's Adam with Keras' bias-correction rounding as a noise variant
    of the TF1 reference (`verify.runners.tf1.adam_variants`), when the reference's model_fn
    creates an `AdamOptimizer` and another side is Keras: two implementation lines, then the
    case's `noise_variants`; none otherwise."""
    if sides[0].kind != "tf1" or not any(s.kind == "keras" for s in sides):
        return []
    try:
        source = inspect.getsource(_load(sides[0].entries[0]))
    except (OSError, TypeError, ScaffoldError):
        return []
    if "AdamOptimizer" not in source:
        return []
    runner = re.sub(r"model_fn=(\w+)", r"model_fn=with_pow_adam(\1)", sides[0].runner_code())
    return [f"        Implementation({POW_ADAM!r}, {runner},",
            f"                       {_constant(sides[0].name)}_NAMES),",
            "    # TF1's Adam keeps beta^t as float32 running products, Keras computes "
            "pow(beta, t): the",
            "    # same formula rounded another way (1.7e-5 apart in the first steps' step "
            "size), measured as noise",
            f"    noise_variants={{{sides[0].name!r}: [{POW_ADAM!r}]}},"]


def _verify_names(sides: list[Side], inferred: Inferred) -> list[str]:
    """What the case module imports from `verify`: the case's classes, its runners, and
    `Mapped`/`Transpose` when a proposed map uses them."""
    maps = "".join(p.name_map_code() for p in inferred.proposals.values())
    used = {"Case", "Implementation", "NameMap", *(RUNNERS[side.kind] for side in sides),
            *(name for name in ("Mapped", "Transpose") if f"{name}(" in maps)}
    return sorted(used)


def _constant(name: str) -> str:
    constant = re.sub(r"\W", "_", name).upper()
    return constant if not keyword.iskeyword(constant) else constant + "_"


def check_target(directory: Path) -> None:
    """Refuse a package directory `init` must not write: an existing path, a name that is not a
    Python package name, or one an importable module already has (the case package would
    shadow it or be shadowed)."""
    directory = Path(directory)
    name = directory.name
    if directory.exists():
        raise ScaffoldError(f"{directory} exists: choose another name or --out, or remove it "
                            f"(init never overwrites)")
    if not name.isidentifier() or keyword.iskeyword(name):
        raise ScaffoldError(f"{name!r} is not a Python package name: use letters, digits and "
                            f"underscores (e.g. my_migration)")
    if importlib.util.find_spec(name) is not None:
        raise ScaffoldError(f"a module named {name!r} is already importable (your pipeline's "
                            f"own package?): the case package would shadow it or be "
                            f"shadowed; choose another name (e.g. {name}_parity)")


def write_package(directory: Path, code: str) -> Path:
    """Write the package at `directory` whole (a temporary directory, then a rename), after
    `check_target`."""
    directory = Path(directory)
    check_target(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}-", dir=directory.parent))
    try:
        (staging / "__init__.py").write_text(code)
        staging.rename(directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return directory / "__init__.py"
