"""Experiment specs: YAML files validated by pydantic, then against each plugin's own model.

A spec names every component as ``{name, params}``. Validation happens in two passes:

1. the spec's structure (:class:`Spec`, ``extra="forbid"`` everywhere);
2. after plugin discovery, each component's ``name`` must exist for its kind and its
   ``params`` must validate against that plugin's pydantic model (derived from the
   plugin's ``__init__`` signature, see :func:`selbench.contract.api.params_model`).

Each component's params are validated once, here; the :class:`ResolvedSpec` carries the
validated models, and builds every plugin from them without validating again.

Every problem is reported as one line naming the YAML path, e.g.
``experiments[1].methods[3].recalibrator.params.lr: Input should be a valid number``.

Validation catches everything that can be known without running: besides the structure,
names and parameters, every combination of plugins is checked against the capabilities the
plugins declare (:mod:`selbench.contract.api`: a scheme's required losses and selector/recalibrator
kinds, the dataset inputs a backbone reads), seeds lie in the range every seeded generator
accepts (:data:`SEED_MAX`), names fit in one file-name component (:data:`NAME_MAX`), the
declared input files exist, and the YAML itself is UTF-8, has no duplicated key and is not
nested absurdly deep (:data:`MAX_DEPTH`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from selbench.contract.api import (
    CoverageLoss,
    DifferentiableRecalibrator,
    SelectionLoss,
    TrainableSelector,
)
from selbench.contract.inputs import InputSpec, check_exists, declared_inputs, resolve_path
from selbench.contract.registry import (
    PluginError,
    Registered,
    Registry,
    format_validation_error,
    get_registry,
)
from selbench.measure.metrics import DEFAULT_BETAS, DEFAULT_COLUMNS, METRICS, unknown_metric
from selbench.spec.executor import ExecutorOptions

__all__ = [
    "MAX_DEPTH",
    "NAME_MAX",
    "SEED_MAX",
    "SPEC_VERSION",
    "Component",
    "BootstrapSpec",
    "ExperimentSpec",
    "GuaranteeSpec",
    "MethodSpec",
    "ResolvedSpec",
    "Spec",
    "SpecError",
    "apply_overrides",
    "load_spec",
]

SPEC_VERSION = 1

#: Largest seed: numpy's ``default_rng`` takes non-negative integers, ``np.random.seed`` and
#: scikit-learn's ``random_state`` take ``0 <= seed < 2**32``, ``torch.manual_seed`` takes
#: ``< 2**64``; so every consumer accepts ``0 <= seed <= 2**32 - 1``.
SEED_MAX = 2**32 - 1

#: Longest spec or experiment name, in characters (ASCII only, so also bytes). Names become
#: folder names (``results/<spec>/``, ``cells/<experiment>/``, ``plots/<experiment>/``), and a
#: file-name component is at most 255 bytes; 200 leaves room for the temporary names of
#: atomic writes (``.<name>.<random>.tmp``). Method labels need no bound: their folders are
#: slugs of at most 55 characters.
NAME_MAX = 200

#: Deepest nesting of lists and mappings a spec may have (a real one needs about 8).
MAX_DEPTH = 64

#: Most values a spec may hold once YAML aliases are expanded (a real one has a few hundred).
MAX_VALUES = 100_000

_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$"


class SpecError(ValueError):
    """A spec is malformed; ``errors`` holds one ``path: message`` line per problem."""

    def __init__(self, errors: list[str], source: str | None = None):
        self.errors = list(errors)
        self.source = source
        head = f"invalid spec {source}" if source else "invalid spec"
        super().__init__(head + ":\n" + "\n".join("  " + e for e in self.errors))


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Component(_Model):
    """A plugin reference: its registered ``name`` and the ``params`` for its factory."""

    name: str = Field(min_length=1)
    params: dict[str, Any] = Field(default_factory=dict)


class MethodSpec(_Model):
    """One leaderboard row: a scheme applied to a selector and a recalibrator."""

    label: str = Field(min_length=1, description="row name in the leaderboard")
    scheme: Component
    selector: Component = Field(default_factory=lambda: Component(name="none"))
    recalibrator: Component = Field(default_factory=lambda: Component(name="none"))
    loss: Component | None = Field(default=None, description="selective loss (trained schemes)")
    coverage: Component | None = Field(default=None, description="coverage loss (trained schemes)")


class GuaranteeSpec(_Model):
    """Hoeffding-guaranteed coverage: lower τ until coverage − ε ≥ β with prob. 1 − δ."""

    delta: float = Field(gt=0.0, lt=1.0)


class BootstrapSpec(_Model):
    """Bootstrap intervals of each cell's metrics over its evaluation examples
    (:func:`selbench.measure.bootstrap.selective_intervals`; 0 resamples: none)."""

    resamples: int = Field(200, ge=0, le=100_000, description="resamples per cell (0: off)")
    level: float = Field(0.95, gt=0.0, lt=1.0, description="confidence level")


def _metric_names(v: list[str] | None) -> list[str] | None:
    """A ``metrics:`` list: registered names (did-you-mean otherwise), each once."""
    if v is None:
        return v
    if not v:
        raise PydanticCustomError(
            "no_metrics", "list at least one metric, or leave metrics out for the paper's set")
    for name in v:
        if name not in METRICS:
            raise PydanticCustomError("unknown_metric", "{msg}", {"msg": unknown_metric(name)})
    dup = sorted({n for n in v if v.count(n) > 1})
    if dup:
        raise PydanticCustomError("metric_twice", "metrics listed twice: {dup}",
                                  {"dup": ", ".join(dup)})
    return v


#: the leaderboard columns of an experiment, registry names (see :data:`METRICS`)
MetricNames = Annotated[list[str] | None, AfterValidator(_metric_names)]


def _name_length(v: str) -> str:
    if len(v) > NAME_MAX:
        raise PydanticCustomError(
            "name_too_long",
            "names become folder names under results/; at most {limit} characters, got {n}",
            {"limit": NAME_MAX, "n": len(v)},
        )
    return v


def _seed_not_bool(v: Any) -> Any:
    if isinstance(v, bool):
        raise PydanticCustomError("seed_bool", "a seed is an integer, not true or false")
    return v


def _seed_range(v: int) -> int:
    if not 0 <= v <= SEED_MAX:
        raise PydanticCustomError(
            "seed_range",
            "seed {seed} is outside 0 <= seed <= {max} (2**32 - 1), the range numpy's and "
            "torch's seeding accept",
            {"seed": v, "max": SEED_MAX},
        )
    return v


#: an experiment or spec name: one folder name under results/
Name = Annotated[str, Field(min_length=1, pattern=_NAME_PATTERN), AfterValidator(_name_length)]
#: a seed every seeded generator accepts (see :data:`SEED_MAX`)
Seed = Annotated[int, BeforeValidator(_seed_not_bool), AfterValidator(_seed_range)]


class ExperimentSpec(_Model):
    name: Name
    dataset: Component
    backbone: Component
    fit_split: str = Field(description="labelled split the methods are fitted on")
    eval_split: str = Field(description="target split the methods are evaluated on")
    n_fit: int | None = Field(default=None, gt=0, description="fitting examples drawn per seed")
    n_eval: int | None = Field(
        default=None, gt=0, description="evaluation examples (a fixed seeded sample)"
    )
    betas: list[float] = Field(default_factory=lambda: [float(b) for b in DEFAULT_BETAS])
    train_beta: float | Literal["per_beta"] = Field(
        default=0.5,
        description="coverage the selectors are trained for, or per_beta for one model per β",
    )
    report: Literal["auc", "betas"] = "auc"
    coverage_guarantee: GuaranteeSpec | None = None
    metrics: MetricNames = Field(
        default=None,
        description="leaderboard columns, names of selbench.measure.metrics.METRICS (default: the "
                    "spec's metrics, else the paper's set)",
    )
    bootstrap: BootstrapSpec = Field(default_factory=BootstrapSpec)
    optional: bool = Field(
        default=False,
        description="skip this experiment (with one line saying why) when an input file or "
                    "folder it declares is missing, instead of failing the run; "
                    "`selbench run --no-optional` leaves every optional experiment out",
    )
    methods: list[MethodSpec] = Field(min_length=1)

    @field_validator("betas")
    @classmethod
    def _betas(cls, v: list[float]) -> list[float]:
        if not v:
            raise ValueError("at least one coverage level is needed")
        if any(not (0.0 < b <= 1.0) for b in v):
            raise ValueError("every coverage level must lie in (0, 1]")
        if sorted(set(v)) != list(v):
            raise ValueError("coverage levels must be strictly increasing")
        return v

    @field_validator("train_beta")
    @classmethod
    def _train_beta(cls, v: float | str) -> float | str:
        if isinstance(v, float) and not (0.0 < v <= 1.0):
            raise ValueError("train_beta must lie in (0, 1] or be 'per_beta'")
        return v

    @model_validator(mode="after")
    def _unique_labels(self) -> ExperimentSpec:
        seen: set[str] = set()
        for m in self.methods:
            if m.label in seen:
                raise ValueError(f"method label {m.label!r} is used twice")
            seen.add(m.label)
        return self


class Spec(_Model):
    spec_version: Literal[1]
    name: Name
    description: str = ""
    seeds: list[Seed] = Field(default_factory=lambda: [0], min_length=1)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    metrics: MetricNames = Field(
        default=None,
        description="leaderboard columns of every experiment that does not list its own "
                    "(default: the paper's ECE₁, ECE₂, Brier, accuracy, coverage)",
    )
    experiments: list[ExperimentSpec] = Field(min_length=1)
    executor: ExecutorOptions | None = Field(
        default=None,
        description="where the cells are computed (selbench.execution.executors): inline, local or "
                    "submitit, with its options; `selbench run --executor` wins. How a spec "
                    "runs, not what it computes: left out of its canonical form and hash",
    )

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError("seeds must be distinct")
        return v

    @model_validator(mode="after")
    def _unique_names(self) -> Spec:
        names = [e.name for e in self.experiments]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ValueError(f"experiment names must be unique, repeated: {sorted(dup)}")
        return self

    @model_validator(mode="after")
    def _columns(self) -> Spec:
        """Each experiment's ``metrics``: its own list, else the spec's, else the paper's set
        plus the guaranteed coverage where the experiment asks for a coverage guarantee."""
        for e_i, exp in enumerate(self.experiments):
            chosen = exp.metrics if exp.metrics is not None else self.metrics
            if chosen is None:
                chosen = list(DEFAULT_COLUMNS) + (
                    ["guaranteed_coverage"] if exp.coverage_guarantee else [])
            for name in chosen:
                needs = METRICS[name].needs
                if needs and getattr(exp, needs) is None:
                    where = f"experiments[{e_i}].metrics" if exp.metrics is not None else "metrics"
                    raise PydanticCustomError(
                        "metric_needs", "{where}: {name} needs {needs} in experiments[{i}] "
                        "({exp})", {"where": where, "name": repr(name), "needs": needs,
                                    "i": e_i, "exp": exp.name})
            exp.metrics = list(chosen)
        return self


def _params_key(kind: str, comp: Component) -> tuple[str, str, str]:
    """What identifies a component's validated params: kind, name and the raw params."""
    raw = json.dumps(comp.params, sort_keys=True, separators=(",", ":"), default=repr)
    return kind, comp.name, raw


class ResolvedSpec:
    """A validated spec with every plugin found and every ``params`` validated.

    The validated params models are kept (``validated``, filled by :func:`load_spec`), so a
    component is validated once however often it is built or hashed.
    """

    def __init__(
        self,
        spec: Spec,
        registry: Registry,
        raw: dict,
        source: str | None,
        base_dir: str | Path | None = None,
        validated: dict[tuple[str, str, str], BaseModel] | None = None,
    ):
        self.spec = spec
        self.registry = registry
        self.raw = raw
        self.source = source
        #: relative input paths resolve against this folder: the spec file's (cwd for dicts)
        self.base_dir = Path(base_dir) if base_dir is not None else (
            Path(source).resolve().parent if source is not None else Path.cwd()
        )
        self._validated: dict[tuple[str, str, str], BaseModel] = dict(validated or {})
        self._resolved: dict[tuple[str, str, str], BaseModel] = {}
        #: (experiment name, why) of the optional experiments :func:`load_spec` left out
        self.skipped: list[tuple[str, str]] = []

    def validated(self, kind: str, comp: Component) -> BaseModel:
        """The component's params validated against its plugin's model (once; remembered)."""
        key = _params_key(kind, comp)
        model = self._validated.get(key)
        if model is None:
            model = self.registry.get(kind, comp.name).validate_params(comp.params)
            self._validated[key] = model
        return model

    def resolved_params(self, kind: str, comp: Component) -> BaseModel:
        """:meth:`validated`, with each declared input path made absolute against
        :attr:`base_dir` (see :mod:`selbench.contract.inputs`): what the plugin is built with."""
        key = _params_key(kind, comp)
        model = self._resolved.get(key)
        if model is None:
            model = self.validated(kind, comp)
            reg = self.registry.get(kind, comp.name)
            update = {name: resolve_path(getattr(model, name), self.base_dir)
                      for name in declared_inputs(reg.plugin.params)
                      if isinstance(getattr(model, name, None), str)}
            if update:
                model = model.model_copy(update=update)
            self._resolved[key] = model
        return model

    def canonical(self) -> dict:
        """The spec with defaults filled in (plugin params included), JSON-ready."""
        data = self.spec.model_dump(mode="json", exclude={"executor"})
        for e_i, exp in enumerate(self.spec.experiments):
            d = data["experiments"][e_i]
            d["dataset"]["params"] = self.params("dataset", exp.dataset)
            d["backbone"]["params"] = self.params("backbone", exp.backbone)
            for m_i, m in enumerate(exp.methods):
                dm = d["methods"][m_i]
                for kind, field in METHOD_FIELDS:
                    comp = getattr(m, field)
                    if comp is not None:
                        dm[field]["params"] = self.params(kind, comp)
        return data

    def params(self, kind: str, comp: Component) -> dict:
        """Validated params with defaults filled in and declared input paths resolved
        against :attr:`base_dir` (see :mod:`selbench.contract.inputs`), JSON-ready (a new dict)."""
        return self.resolved_params(kind, comp).model_dump(mode="json")

    def inputs(self, kind: str, comp: Component) -> dict[str, tuple[str, InputSpec]]:
        """Parameter -> (resolved path, declaration) for every input ``comp`` names."""
        reg = self.registry.get(kind, comp.name)
        params = self.params(kind, comp)
        return {
            field: (params[field], spec)
            for field, spec in declared_inputs(reg.plugin.params).items()
            if isinstance(params.get(field), str)
        }

    def build(self, kind: str, comp: Component) -> Any:
        """The component's plugin, built from its validated (and resolved) params."""
        return self.registry.get(kind, comp.name).build(self.resolved_params(kind, comp))

    def hash(self) -> str:
        return content_hash(self.canonical())


METHOD_FIELDS = (
    ("scheme", "scheme"),
    ("selector", "selector"),
    ("recalibrator", "recalibrator"),
    ("loss", "loss"),
    ("loss", "coverage"),
)


def content_hash(obj: Any) -> str:
    """SHA-256 of the canonical JSON form of ``obj``."""
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


# --------------------------------------------------------------------------- loading
class _YamlProblem(Exception):
    """A YAML document that cannot become a spec; ``line`` is 1-based."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        super().__init__(message)
        self.message, self.line, self.column = message, line, column

    def format(self) -> str:
        where = f" (line {self.line}, column {self.column})" if self.line is not None else ""
        return f"<yaml>{where}: {self.message}"


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader that refuses nesting deeper than :data:`MAX_DEPTH` while composing (so a
    pathological file cannot exhaust Python's recursion limit)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        if not self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent):
            return super().compose_node(parent, index)
        self._depth += 1  # lists and mappings only, as in _shape_problem
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise _YamlProblem(f"nested more than {MAX_DEPTH} levels deep",
                                   mark.line + 1, mark.column + 1)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


_MERGE_TAG = "tag:yaml.org,2002:merge"


def _duplicate_keys(root: yaml.Node) -> list[str]:
    """``path: duplicate key ...`` for every mapping that sets a key twice (YAML would keep
    only the last value). Keys brought in by a ``<<`` merge may be overridden: not reported.
    Each node is visited once, whatever number of aliases refer to it."""
    problems: list[str] = []
    seen_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, str]] = [(root, "")]
    while stack:
        node, path = stack.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend((child, f"{path}[{i}]") for i, child in enumerate(node.value))
        elif isinstance(node, yaml.MappingNode):
            first: dict[tuple[str, str], yaml.Node] = {}
            for key, value in node.value:
                if key.tag == _MERGE_TAG:
                    stack.append((value, path))
                    continue
                if not isinstance(key, yaml.ScalarNode):
                    stack.append((value, f"{path}.?" if path else "?"))
                    continue
                sub = f"{path}.{key.value}" if path else str(key.value)
                ident = (key.tag, key.value)
                if ident in first:
                    prev = first[ident].start_mark
                    mark = key.start_mark
                    problems.append(
                        f"{sub}: duplicate key {key.value!r} at line {mark.line + 1}, column "
                        f"{mark.column + 1} (first set at line {prev.line + 1}, column "
                        f"{prev.column + 1}); YAML would silently keep only the last value"
                    )
                else:
                    first[ident] = key
                stack.append((value, sub))
    return problems


def _parse_yaml(text: str) -> Any:
    """Parse one YAML document with :class:`_SpecLoader`; raises :class:`_YamlProblem` or
    ``SpecError`` (duplicate keys)."""
    try:
        loader = _SpecLoader(text)  # checks that every character is printable
        try:
            node = loader.get_single_node()
            if node is None:
                return None
            dups = _duplicate_keys(node)
            if dups:
                raise SpecError(dups)
            return loader.construct_document(node)
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        problem = exc.problem or exc.context or str(exc).splitlines()[0]
        raise _YamlProblem(problem, *((mark.line + 1, mark.column + 1) if mark else ())) from None
    except yaml.reader.ReaderError as exc:  # a non-printable character
        before = text[: exc.position]
        char = exc.character if isinstance(exc.character, int) else ord(exc.character[:1] or "?")
        raise _YamlProblem(
            f"unacceptable character U+{char:04X} ({exc.reason})",
            before.count("\n") + 1, exc.position - (before.rfind("\n") + 1) + 1,
        ) from None
    except yaml.YAMLError as exc:
        raise _YamlProblem(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
    except RecursionError:  # not expected with the depth limit above; never a traceback
        raise _YamlProblem(f"nested too deeply to read (at most {MAX_DEPTH} levels)") from None


def read_yaml(path: str | Path) -> dict:
    """Read a spec file: UTF-8 YAML, one mapping, no duplicated key; raises
    :class:`SpecError` naming the file and, for YAML problems, the line."""
    path = Path(path)
    src = str(path)
    if path.is_dir():
        raise SpecError([f"{path}: is a folder, not a spec file"], src)
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        raise SpecError([f"{path}: no such file"], src) from None
    except OSError as exc:
        raise SpecError([f"{path}: cannot read ({exc.strerror or exc})"], src) from None
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = blob[: exc.start]
        line = before.count(b"\n") + 1
        column = exc.start - (before.rfind(b"\n") + 1) + 1
        raise SpecError([
            f"{path}: not UTF-8 text: byte 0x{blob[exc.start]:02x} at byte offset {exc.start} "
            f"(line {line}, column {column}); save the spec as UTF-8"
        ], src) from None
    try:
        data = _parse_yaml(text)
    except _YamlProblem as exc:
        raise SpecError([exc.format()], src) from None
    except SpecError as exc:
        raise SpecError(exc.errors, src) from None
    if data is None:
        raise SpecError([f"{path}: the file is empty; a spec is a YAML mapping with "
                         "spec_version, name, ..."], src)
    if not isinstance(data, dict):
        raise SpecError(["<root>: a spec is a YAML mapping with spec_version, name, ..."], src)
    return data


def _shape_problem(data: Any) -> str | None:
    """A raw spec's nesting deeper than :data:`MAX_DEPTH`, a reference cycle, or more than
    :data:`MAX_VALUES` values once shared (aliased) parts are expanded; else None."""
    height: dict[int, tuple[int, int]] = {}  # id -> (levels below, values within)
    on_path: set[int] = set()
    stack: list[tuple[Any, str, int, bool]] = [(data, "", 0, False)]
    while stack:
        obj, path, depth, done = stack.pop()
        if isinstance(obj, dict):
            children = [(f"{path}.{k}" if path else str(k), v) for k, v in obj.items()]
        elif isinstance(obj, list):
            children = [(f"{path}[{i}]", v) for i, v in enumerate(obj)]
        else:
            continue
        key = id(obj)
        where = path or "<root>"
        if done:
            on_path.discard(key)
            sub = [height.get(id(v), (0, 1)) for _, v in children]
            h = 1 + max((d for d, _ in sub), default=0)
            n = 1 + sum(c for _, c in sub)
            if n > MAX_VALUES:
                return f"{where}: more than {MAX_VALUES} values (YAML aliases expand to too much)"
            height[key] = (h, n)
            continue
        if key in on_path:
            return f"{where}: refers to itself (a reference cycle)"
        if key in height:
            if depth + height[key][0] > MAX_DEPTH:
                return f"{where}: nested more than {MAX_DEPTH} levels deep"
            continue
        if depth >= MAX_DEPTH:
            return f"{where}: nested more than {MAX_DEPTH} levels deep"
        on_path.add(key)
        stack.append((obj, path, depth, True))
        stack.extend((v, sub_path, depth + 1, False) for sub_path, v in children)
    return None


_TOKEN = re.compile(r"([^.\[\]]+)|\[(\d+)\]")


def _parse_path(path: str) -> list[str | int]:
    parts: list[str | int] = []
    pos = 0
    for m in _TOKEN.finditer(path):
        if m.start() != pos and path[pos:m.start()] != ".":
            raise ValueError(f"cannot parse key path {path!r}")
        parts.append(m.group(1) if m.group(1) is not None else int(m.group(2)))
        pos = m.end()
    if pos != len(path) or not parts:
        raise ValueError(f"cannot parse key path {path!r}")
    return parts


def _unshared(data: Any) -> Any:
    """A copy of a raw spec in which no dict or list appears twice. YAML anchors and aliases
    (``methods: *methods``) load as one shared object, which ``copy.deepcopy`` keeps shared:
    an override of ``experiments[0].methods`` would change ``experiments[1]`` too."""
    if isinstance(data, dict):
        return {k: _unshared(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_unshared(v) for v in data]
    return copy.deepcopy(data)


def apply_overrides(data: dict, overrides: list[str] | tuple[str, ...]) -> dict:
    """Apply ``key.path=value`` overrides (value parsed as YAML) to a raw spec dict.

    Paths use dots and ``[i]`` indices; inside a list of experiments or methods an element
    may also be named: ``experiments.digits-shift.n_fit=200`` or
    ``experiments[0].methods.Temp.scheme.params.lr=0.01``.
    """
    data = _unshared(data)
    errors = []
    for item in overrides:
        if "=" not in item:
            errors.append(f"--set {item}: expected key=value")
            continue
        key, _, value = item.partition("=")
        try:
            parts = _parse_path(key.strip())
            parsed = _parse_yaml(value) if value.strip() else ""
        except _YamlProblem as exc:
            errors.append(f"--set {item}: {exc.format()}")
            continue
        except SpecError as exc:
            errors += [f"--set {item}: {e}" for e in exc.errors]
            continue
        except ValueError as exc:
            errors.append(f"--set {item}: {exc}")
            continue
        node: Any = data
        ok = True
        for i, part in enumerate(parts):
            last = i == len(parts) - 1
            if isinstance(node, list):
                idx = part if isinstance(part, int) else _find_named(node, part)
                if idx is None or not (0 <= idx < len(node)):
                    errors.append(f"--set {item}: no element {part!r} at {_fmt(parts[:i])}")
                    ok = False
                    break
                if last:
                    node[idx] = parsed
                else:
                    node = node[idx]
            elif isinstance(node, dict):
                if isinstance(part, int):
                    errors.append(f"--set {item}: {_fmt(parts[:i])} is not a list")
                    ok = False
                    break
                if last:
                    node[part] = parsed
                else:
                    node = node.setdefault(part, {})
            else:
                errors.append(f"--set {item}: {_fmt(parts[:i])} is not a mapping or list")
                ok = False
                break
        del ok
    if errors:
        raise SpecError(errors, "--set")
    return data


def _find_named(items: list, name: str) -> int | None:
    for i, el in enumerate(items):
        if isinstance(el, dict) and (el.get("name") == name or el.get("label") == name):
            return i
    return None


def _fmt(parts: list[str | int]) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else p)
    return out or "<root>"


def load_spec(
    source: str | Path | dict,
    *,
    overrides: list[str] | tuple[str, ...] = (),
    registry: Registry | None = None,
    optional: bool = True,
) -> ResolvedSpec:
    """Read, validate and resolve a spec (path or dict); raises :class:`SpecError`.

    An experiment marked ``optional: true`` is left out of the resolved spec (its canonical
    form, hash and cells), and listed in :attr:`ResolvedSpec.skipped` with the reason, when
    one of the input files or folders it declares is missing, or always with
    ``optional=False``. Experiments keep their names; the indices in later messages
    (``experiments[i]``) count the experiments that are kept.
    """
    label = None if isinstance(source, dict) else str(source)
    raw = source if isinstance(source, dict) else read_yaml(source)
    problem = _shape_problem(raw)
    if problem is None and overrides:
        raw = apply_overrides(raw, overrides)
        problem = _shape_problem(raw)
    if problem is not None:
        raise SpecError([problem], label)
    if raw is source:
        raw = copy.deepcopy(source)
    try:
        spec = Spec.model_validate(raw)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, ""), label) from None
    registry = registry or get_registry()
    errors: list[str] = []
    validated: dict[tuple[str, str, str], BaseModel] = {}

    def _check(kind: str, comp: Component, path: str) -> Registered | None:
        return _check_component(registry, kind, comp, path, errors, validated)

    for e_i, exp in enumerate(spec.experiments):
        base = f"experiments[{e_i}]"
        dataset = _check("dataset", exp.dataset, f"{base}.dataset")
        backbone = _check("backbone", exp.backbone, f"{base}.backbone")
        if dataset is not None and backbone is not None:
            _check_inputs_kind(registry, dataset, backbone, f"{base}.backbone", errors)
        for m_i, m in enumerate(exp.methods):
            mbase = f"{base}.methods[{m_i}]"
            regs: dict[str, Registered | None] = {}
            for kind, field in METHOD_FIELDS:
                comp = getattr(m, field)
                if comp is None:
                    continue
                reg = regs[field] = _check(kind, comp, f"{mbase}.{field}")
                if reg is not None and field in ("loss", "coverage"):
                    want = SelectionLoss if field == "loss" else CoverageLoss
                    factory = reg.plugin.factory
                    if isinstance(factory, type) and not issubclass(factory, want):
                        regs[field] = None  # not checked against the scheme below
                        errors.append(
                            f"{mbase}.{field}.name: {comp.name!r} is a "
                            f"{'coverage' if field == 'loss' else 'selection'} loss; "
                            f"`{field}` expects a {want.__name__}"
                        )
            check_method(registry, m, regs, mbase, errors)
    if errors:
        raise SpecError(errors, label)
    resolved = ResolvedSpec(spec, registry, raw, label, validated=validated)
    skipped: list[tuple[str, str]] = []
    keep: list[int] = []
    for e_i, exp in enumerate(spec.experiments):
        base = f"experiments[{e_i}]"
        if exp.optional and not optional:
            skipped.append((exp.name, "optional, left out by --no-optional"))
            continue
        comps = [("dataset", "dataset", exp.dataset), ("backbone", "backbone", exp.backbone)]
        for m_i, m in enumerate(exp.methods):
            comps += [(kind, f"methods[{m_i}].{field}", getattr(m, field))
                      for kind, field in METHOD_FIELDS if getattr(m, field) is not None]
        missing: list[str] = []
        for kind, where, comp in comps:
            for pname, (path, ispec) in resolved.inputs(kind, comp).items():
                problem = check_exists(path, ispec)
                if problem is not None and (ispec.must_exist or Path(path).exists()):
                    missing.append(f"{base}.{where}.params.{pname}: {problem}")
        if missing and exp.optional:
            skipped.append((exp.name, f"optional, skipped: {missing[0]}"))
        else:
            errors.extend(missing)
            keep.append(e_i)
    if errors:
        raise SpecError(sorted(set(errors), key=errors.index), label)
    if not keep:
        raise SpecError(["experiments: every experiment is optional and skipped ("
                         + "; ".join(f"{name}: {why}" for name, why in skipped) + ")"], label)
    if skipped:  # the spec without them: its canonical form, hash and cells leave them out
        spec = spec.model_copy(update={"experiments": [spec.experiments[i] for i in keep]})
        raw = {**raw, "experiments": [raw["experiments"][i] for i in keep]}
        resolved = ResolvedSpec(spec, registry, raw, label, validated=validated)
    resolved.skipped = skipped
    return resolved


def _check_component(registry: Registry, kind: str, comp: Component, path: str,
                     errors: list[str], validated: dict) -> Registered | None:
    """Find the component's plugin and validate its params (kept in ``validated``)."""
    try:
        reg = registry.get(kind, comp.name)
    except PluginError as exc:
        errors.append(f"{path}.name: {exc}")
        return None
    key = _params_key(kind, comp)
    if key not in validated:
        try:
            validated[key] = reg.validate_params(comp.params)
        except ValidationError as exc:
            errors.extend(format_validation_error(exc, f"{path}.params"))
    return reg


# --------------------------------------------------------------------------- capabilities
# What plugins declare about each other (see the table in :mod:`selbench.contract.api`), read from
# the factory when it is a class. Nothing here depends on a plugin's name.
_UNDECLARED = object()


def _cap(reg: Registered | None, attr: str, default: Any = _UNDECLARED) -> Any:
    """The capability ``attr`` of a plugin's factory class; ``default`` when the class does
    not have it; :data:`_UNDECLARED` when the factory is not a class (nothing known)."""
    factory = reg.plugin.factory if reg is not None else None
    if not isinstance(factory, type):
        return _UNDECLARED
    return getattr(factory, attr, default)


def _is(reg: Registered | None, base: type) -> Any:
    """Whether a plugin's factory class is a ``base`` (the typed protocols of
    :mod:`selbench.contract.api`); :data:`_UNDECLARED` when the factory is not a class."""
    factory = reg.plugin.factory if reg is not None else None
    if not isinstance(factory, type):
        return _UNDECLARED
    return issubclass(factory, base)


def _names(registry: Registry, kind: str, want: Any, sep: str = ", ") -> str:
    """The registered plugins of ``kind`` whose factory satisfies ``want(factory)``."""
    return sep.join(r.plugin.name for r in registry.all(kind)
                    if isinstance(r.plugin.factory, type) and want(r.plugin.factory))


def _hint(text: str, names: str) -> str:
    return _hints((text, names))


def _hints(*pairs: tuple[str, str]) -> str:
    """`` (a: x, y; b: z)`` for the (text, names) pairs whose names are not empty."""
    parts = [f"{text}: {names}" for text, names in pairs if names]
    return f" ({'; '.join(parts)})" if parts else ""


def _check_inputs_kind(registry: Registry, dataset: Registered, backbone: Registered,
                       path: str, errors: list[str]) -> None:
    """The dataset's ``input_kind`` must be one of the backbone's ``input_kinds``."""
    provided = _cap(dataset, "input_kind", None)
    accepted = _cap(backbone, "input_kinds", None)
    if not isinstance(provided, str) or accepted in (None, _UNDECLARED) or provided in accepted:
        return
    others = _names(registry, "backbone",
                    lambda f: provided in (getattr(f, "input_kinds", None) or ()))
    errors.append(
        f"{path}.name: backbone {backbone.plugin.name!r} reads {' or '.join(sorted(accepted))} "
        f"inputs, but dataset {dataset.plugin.name!r} provides {provided}"
        + _hint(f"backbones that read {provided}", others)
    )


def check_method(registry: Registry, m: MethodSpec, regs: dict[str, Registered | None],
                  mbase: str, errors: list[str]) -> None:
    """A method's selector, recalibrator and losses against its scheme's declarations."""
    scheme = regs.get("scheme")
    if scheme is None or not isinstance(scheme.plugin.factory, type):
        return
    name = scheme.plugin.name
    requires = _cap(scheme, "requires", frozenset())
    if "loss" in requires and m.loss is None:
        choices = _names(registry, "loss", lambda f: issubclass(f, SelectionLoss), "|")
        errors.append(f"{mbase}.loss: scheme {name!r} needs a selective loss "
                      f"(loss: {{name: {choices or '...'}}})")
    if "coverage" in requires and m.coverage is None:
        choices = _names(registry, "loss", lambda f: issubclass(f, CoverageLoss), "|")
        errors.append(f"{mbase}.coverage: scheme {name!r} needs a coverage loss "
                      f"(coverage: {{name: {choices or '...'}}})")

    selector = regs.get("selector")
    must_train = _cap(scheme, "selector_must_be_trainable", None)
    trainable = _is(selector, TrainableSelector)
    if must_train is not None and trainable is not _UNDECLARED and bool(trainable) != must_train:
        sel = f"selector {m.selector.name!r}"
        if must_train:
            errors.append(
                f"{mbase}.selector.name: scheme {name!r} trains the selector through its loss; "
                f"{sel} is not trainable"
                + _hint("trainable selectors", _names(
                    registry, "selector", lambda f: issubclass(f, TrainableSelector)))
            )
        else:
            errors.append(
                f"{mbase}.selector.name: scheme {name!r} only fits non-trainable selectors; "
                f"{sel} is trained through a loss"
                + _hint("schemes that train it", _names(
                    registry, "scheme", lambda f: getattr(f, "selector_must_be_trainable", None)
                    is True))
            )

    recal = regs.get("recalibrator")
    rname = f"recalibrator {m.recalibrator.name!r}"
    differentiable = _is(recal, DifferentiableRecalibrator)
    not_differentiable = differentiable is not _UNDECLARED and not differentiable
    if _cap(scheme, "recalibrator_must_be_differentiable", False) and not_differentiable:
        errors.append(
            f"{mbase}.recalibrator.name: scheme {name!r} trains the recalibrator with the "
            f"selector and needs a differentiable one; {rname} is not"
            + _hint("differentiable recalibrators", _names(
                registry, "recalibrator", lambda f: issubclass(f, DifferentiableRecalibrator)))
        )
        not_differentiable = False  # reported once: the log-probabilities follow from it
    if (not _cap(scheme, "fits_recalibrator", True)
            and _cap(recal, "usable_unfitted", None) is False):
        errors.append(
            f"{mbase}.recalibrator.name: scheme {name!r} uses the recalibrator as given, "
            f"without fitting it; {rname} must be fitted first"
            + _hint("recalibrators usable unfitted", _names(
                registry, "recalibrator", lambda f: getattr(f, "usable_unfitted", None) is True))
        )

    loss = regs.get("loss")
    if (_cap(scheme, "loss_reads_recalibrator_log_probs", False)
            and _cap(loss, "needs_log_probs", False) is True
            and (not_differentiable or _cap(recal, "provides_log_probs", None) is False)):
        errors.append(
            f"{mbase}.loss.name: loss {m.loss.name!r} needs the recalibrator's "
            f"log-probabilities, which {rname} does not provide"
            + _hints(
                ("losses that do not need them", _names(
                    registry, "loss", lambda f: issubclass(f, SelectionLoss)
                    and not getattr(f, "needs_log_probs", False))),
                ("recalibrators that provide them", _names(
                    registry, "recalibrator", lambda f: issubclass(f, DifferentiableRecalibrator)
                    and getattr(f, "provides_log_probs", None) is True)),
            )
        )
