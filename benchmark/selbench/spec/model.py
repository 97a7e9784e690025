"""The spec's schema: the pydantic models of a spec (:class:`Spec`, :class:`ExperimentSpec`,
:class:`MethodSpec`, :class:`Component` ...), the bounds they enforce (:data:`SEED_MAX`,
:data:`NAME_MAX`, :data:`MAX_DEPTH`), :class:`SpecError`, and :class:`ResolvedSpec`, a spec
whose plugins are found and whose params are validated, with its canonical form and
:func:`content_hash`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from selbench.contract.inputs import InputSpec, declared_inputs, resolve_path
from selbench.contract.registry import Registry
from selbench.contract.search import SearchError, Tune
from selbench.measure.guarantee import RISK_GUARANTEE_COLUMNS
from selbench.measure.metrics import DEFAULT_BETAS, DEFAULT_COLUMNS, METRICS, unknown_metric
from selbench.spec.executor import ExecutorOptions
from selbench.spec.questions import HierarchicalSpec, QuestionsSpec

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


#: the end of an oracle method's label (:class:`MethodTuning`): in every table it is shown in
ORACLE = " (oracle)"


def is_oracle(exp: Any, method: Any) -> bool:
    """Whether ``method`` of ``exp`` is tuned on evaluation labels (an oracle row)."""
    if exp.tuning is None:
        return False
    own = method.tuning.oracle if method.tuning is not None else False
    return bool(own or exp.tuning.oracle)


class MethodTuning(_Model):
    """How one method is tuned, beside the experiment's ``tuning`` block."""

    oracle: bool = Field(
        False, description="score this method's trials on labelled rows of the evaluation "
                           "split (a seeded `inner` share of its evaluation rows, then left out "
                           "of its evaluation): an oracle, never a result; its label gets "
                           "' (oracle)'")


class MethodSpec(_Model):
    """One leaderboard row: a scheme applied to a selector and a recalibrator."""

    label: str = Field(min_length=1, description="row name in the leaderboard")
    scheme: Component
    selector: Component = Field(default_factory=lambda: Component(name="none"))
    recalibrator: Component = Field(default_factory=lambda: Component(name="none"))
    loss: Component | None = Field(default=None, description="selective loss (trained schemes)")
    coverage: Component | None = Field(default=None, description="coverage loss (trained schemes)")
    tuning: MethodTuning | None = Field(
        default=None, description="with the experiment's `tuning`: {oracle: true} tunes this "
                                  "method on evaluation labels (an oracle row)")
    search: SearchSpace = Field(
        default=None,
        description="with the experiment's `tuning`: the parameters tuned, {\"<field>.<param>\": "
                    "{log_uniform|uniform|int: [low, high]} | {choice: [...]} | default}, replacing "
                    "the plugins' declared spaces ({}: not tuned); left out: the declared spaces",
    )

    def components(self) -> Iterator[tuple[str, str, Component]]:
        """(kind, field, component) of each plugin the method uses (absent losses left out)."""
        for kind, attr in METHOD_FIELDS:
            comp = getattr(self, attr)
            if comp is not None:
                yield kind, attr, comp


class PrunerSpec(_Model):
    """Multi-fidelity tuning (``tuning.pruner``): trials report the objective on the held-out
    rows at rungs of ``min_epochs · reduction_factor^(min_early_stopping_rate + k)`` epochs,
    and Optuna's successive-halving pruner (asynchronous, ASHA) stops the losing ones."""

    name: Literal["successive-halving"] = Field(
        description="Optuna's SuccessiveHalvingPruner")
    min_epochs: int = Field(ge=1, le=1_000_000, description="epochs of the first rung "
                                                            "(Optuna's min_resource)")
    reduction_factor: int = Field(4, ge=2, le=100, description="1 in reduction_factor trials "
                                                               "goes on at each rung (Optuna's "
                                                               "default, 4)")
    min_early_stopping_rate: int = Field(0, ge=0, le=20, description="rungs skipped before "
                                                                    "the first")


class TuningSpec(_Model):
    """Equal-budget tuning (:mod:`selbench.execution.tuning`): each method's cell gets ``trials``
    fits on an ``inner`` part of its fitting rows, scored by ``objective`` on the rest (or, with
    ``folds: k``, k fits each on k − 1 folds, scored on the held-out fold and averaged)."""

    trials: int = Field(ge=1, le=100_000, description="Optuna trials per method and seed")
    objective: Annotated[str, AfterValidator(_objective)] = Field(
        description="registry metric scored on the held-out fitting rows")
    over: Literal["train_beta", "betas"] = Field(
        "train_beta", description="score the objective at the cell's training β (train_beta), "
                                  "or its AUC over the experiment's betas (betas: smoother)")
    inner: float = Field(0.3, gt=0.0, lt=1.0,
                         description="fraction of the fitting rows held out to score trials "
                                     "(folds: 1)")
    folds: int = Field(1, ge=1, le=50,
                       description="1: one held-out part (inner); k >= 2: each trial fitted k "
                                   "times on k - 1 of k seeded folds (stratified by the "
                                   "backbone's correctness where possible), the mean of its "
                                   "held-out scores is the objective")
    sampler: Literal["tpe", "random"] = Field("tpe", description="Optuna sampler (seeded)")
    oracle: bool = Field(
        False, description="tune every method on labelled rows of the evaluation split "
                           "(an oracle: rows marked '(oracle)'; see the methods' tuning)")
    pruner: PrunerSpec | None = Field(
        None, description="stop losing trials early (training schemes: their epochs are "
                          "the resource); none: every trial trains to its end")

    @model_validator(mode="after")
    def _inner_or_folds(self) -> TuningSpec:
        if self.folds >= 2 and "inner" in self.model_fields_set:
            raise PydanticCustomError(
                "inner_and_folds", "inner and folds exclude each other: with folds: {k} each "
                "trial is scored on every held-out fold in turn (1/{k} of the fitting rows); "
                "drop inner, or set folds: 1", {"k": self.folds})
        if self.folds >= 2 and self.pruner is not None:
            raise PydanticCustomError(
                "pruner_and_folds", "pruner needs one held-out part (folds: 1): a trial is "
                "judged on its held-out score while it trains, and folds train one after "
                "the other", {})
        return self

    def canonical(self) -> dict[str, Any]:
        """The block as keys and hashes read it: the fields added after the first release
        only where they differ from their defaults (a spec without them keeps its hash and
        its cells), ``inner`` only where it is used (one held-out part)."""
        data = self.model_dump(mode="json")
        for key, default in (("over", "train_beta"), ("folds", 1), ("oracle", False),
                             ("pruner", None)):
            if data[key] == default:
                del data[key]
        if self.folds >= 2:
            del data["inner"]
        return data


class GuaranteeSpec(_Model):
    """Hoeffding-guaranteed coverage: lower τ until coverage − ε ≥ β with prob. 1 − δ."""

    delta: float = Field(gt=0.0, lt=1.0)


class RiskGuaranteeSpec(_Model):
    """Guaranteed selective risk (SGR, :func:`selbench.measure.guarantee.sgr`): a threshold
    chosen on the labelled fitting data so that the selective error is at most ``risk`` with
    probability at least 1 − ``delta``."""

    risk: float = Field(gt=0.0, lt=1.0, description="target selective risk r (top-label error)")
    delta: float = Field(gt=0.0, lt=1.0, description="failure probability δ")


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


#: what a metric's registry ``needs`` may be for it to be a tuning objective: nothing, or
#: the recalibrated distribution (checked against each tuned method's recalibrator by
#: :func:`selbench.spec.capabilities.check_tuning_objective`); a risk guarantee's results
#: are measured from a threshold on the evaluation data, which a trial never has
OBJECTIVE_NEEDS = (None, "log_probs")


def objectives(needs: tuple[str | None, ...] = OBJECTIVE_NEEDS) -> list[str]:
    """The metrics a tuning objective may be: a direction, and needs among ``needs``."""
    return [k for k, m in METRICS.items() if m.marked and m.needs in needs]


def _objective(v: str) -> str:
    """A tuning objective: a registered metric (did-you-mean otherwise) with a direction that
    a trial can measure on held-out rows (:func:`objectives`)."""
    if v not in METRICS:
        raise PydanticCustomError("unknown_metric", "{msg}", {"msg": unknown_metric(v)})
    if not METRICS[v].marked:
        raise PydanticCustomError(
            "objective_direction", "{name} has no direction to optimise (it is set by the spec, "
            "not won); choose one of {ok}", {"name": repr(v), "ok": ", ".join(objectives())})
    if METRICS[v].needs not in OBJECTIVE_NEEDS:
        raise PydanticCustomError(
            "objective_needs", "{name} needs the experiment's {needs}, measured on the "
            "evaluation data only, never on a trial's held-out rows; choose one of {ok}",
            {"name": repr(v), "needs": METRICS[v].needs, "ok": ", ".join(objectives())})
    return v


def _search_space(v: dict | None) -> dict | None:
    """A method's ``search``: ``"<field>.<param>"`` keys, each a distribution or ``default``."""
    if v is None:
        return v
    fields = [f for _, f in METHOD_FIELDS]
    for path, dist in v.items():
        field, dot, param = str(path).partition(".")
        if not dot or not param or field not in fields:
            raise PydanticCustomError(
                "search_path", "{path}: name a parameter as <field>.<param>, <field> one of "
                "{fields} (e.g. scheme.lr)", {"path": repr(path), "fields": ", ".join(fields)})
        if dist == "default":
            continue
        try:
            Tune.parse(dist)
        except SearchError as exc:
            raise PydanticCustomError("search_space", "{path}: {msg}",
                                      {"path": repr(path), "msg": str(exc)}) from None
    return v


#: a method's ``search:`` (see :class:`MethodSpec`)
SearchSpace = Annotated[dict[str, Any] | None, AfterValidator(_search_space)]


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
    risk_guarantee: RiskGuaranteeSpec | None = Field(
        default=None, description="SGR threshold from the fitting data: selective risk ≤ r "
                                  "with probability ≥ 1 − δ; exclusive with coverage_guarantee")
    metrics: MetricNames = Field(
        default=None,
        description="leaderboard columns, names of selbench.measure.metrics.METRICS (default: the "
                    "spec's metrics, else the paper's set)",
    )
    bootstrap: BootstrapSpec = Field(default_factory=BootstrapSpec)
    tuning: TuningSpec | None = Field(
        default=None, description="tune every method with an equal budget on its fitting rows "
                                  "(selbench.execution.tuning); left out: the given parameters")
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
    def _oracle_labels(self) -> ExperimentSpec:
        """An oracle method's label ends with :data:`ORACLE` (added where missing); no other
        label does."""
        for m_i, m in enumerate(self.methods):
            oracle = is_oracle(self, m)
            if oracle and not m.label.endswith(ORACLE):
                m.label = m.label + ORACLE
            elif not oracle and m.label.endswith(ORACLE.strip()):
                raise PydanticCustomError(
                    "oracle_label", "methods[{i}].label: {label} says oracle, but the method "
                    "is not tuned on evaluation labels (its tuning.oracle or the experiment's is "
                    "false)",
                    {"i": m_i, "label": repr(m.label)})
        return self

    @model_validator(mode="after")
    def _unique_labels(self) -> ExperimentSpec:
        seen: set[str] = set()
        for m in self.methods:
            if m.label in seen:
                raise ValueError(f"method label {m.label!r} is used twice")
            seen.add(m.label)
        return self

    @model_validator(mode="after")
    def _one_guarantee(self) -> ExperimentSpec:
        if self.risk_guarantee is not None and self.coverage_guarantee is not None:
            raise PydanticCustomError(
                "two_guarantees", "risk_guarantee and coverage_guarantee are exclusive: a "
                "threshold is chosen for a risk or for a coverage, not both")
        return self

    @model_validator(mode="after")
    def _search_needs_tuning(self) -> ExperimentSpec:
        if self.tuning is None:
            for m_i, m in enumerate(self.methods):
                for field in ("search", "tuning"):
                    if getattr(m, field) is not None:
                        raise PydanticCustomError(
                            "search_untuned", "methods[{i}].{field}: has no effect without the "
                            "experiment's tuning block (tuning: trials, objective)",
                            {"i": m_i, "field": field})
            return self
        if self.tuning.over == "betas" and len(self.betas) < 2:
            raise PydanticCustomError(
                "over_one_beta", "tuning.over: betas takes the AUC over the experiment's "
                "betas, which needs at least two (betas: {betas})", {"betas": self.betas})
        for m_i, m in enumerate(self.methods):
            if is_oracle(self, m) and self.tuning.folds >= 2:
                raise PydanticCustomError(
                    "oracle_folds", "methods[{i}]: an oracle scores its trials on one seeded "
                    "share (tuning.inner) of the evaluation rows; folds: {k} does not apply to "
                    "it (set folds: 1)", {"i": m_i, "k": self.tuning.folds})
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
    questions: QuestionsSpec | None = Field(
        default=None,
        description="pre-registered questions (pairs of methods compared on one metric "
                    "across experiments, with a ROPE), answered in the leaderboard's summary",
    )
    cost: bool = Field(
        default=False,
        description="show the mean fit seconds per cell in the leaderboard and draw a "
                    "cost-versus-quality figure (the Markdown then holds timings)",
    )
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
                    ["guaranteed_coverage"] if exp.coverage_guarantee else []) + (
                    list(RISK_GUARANTEE_COLUMNS) if exp.risk_guarantee else [])
            for name in chosen:
                needs = METRICS[name].needs
                # a setting of the experiment (log_probs: the plugins', spec/capabilities.py)
                if needs in type(exp).model_fields and getattr(exp, needs) is None:
                    where = f"experiments[{e_i}].metrics" if exp.metrics is not None else "metrics"
                    raise PydanticCustomError(
                        "metric_needs", "{where}: {name} needs {needs} in experiments[{i}] "
                        "({exp})", {"where": where, "name": repr(name), "needs": needs,
                                    "i": e_i, "exp": exp.name})
            exp.metrics = list(chosen)
        return self

    @model_validator(mode="after")
    def _question_labels(self) -> Spec:
        """Every label a question names is a method of some experiment, and the questions'
        metric is a column of every experiment (the leaderboard answers from its tables)."""
        q = self.questions
        if q is None:
            return self
        labels = list(dict.fromkeys(m.label for e in self.experiments for m in e.methods))
        for p_i, pair in enumerate(q.pairs):
            where = [f"questions.pairs[{p_i}].a"] + (
                [f"questions.pairs[{p_i}].b"] if isinstance(pair.b, str) else
                [f"questions.pairs[{p_i}].b.best_of[{j}]" for j in range(len(pair.b.best_of))])
            for path, label in zip(where, pair.labels()):
                if label not in labels:
                    raise PydanticCustomError(
                        "question_label", "{path}: {label} is not a method label of any "
                        "experiment; valid labels: {ok}",
                        {"path": path, "label": repr(label), "ok": ", ".join(labels)})
            if not any(set(pair.labels()) <= {m.label for m in e.methods}
                       for e in self.experiments):
                raise PydanticCustomError(
                    "question_nowhere", "questions.pairs[{i}]: no experiment has all of "
                    "{labels}", {"i": p_i, "labels": ", ".join(map(repr, pair.labels()))})
        for e_i, exp in enumerate(self.experiments):
            if q.metric not in (exp.metrics or ()):
                raise PydanticCustomError(
                    "question_metric", "questions.metric: {m} is not a column of "
                    "experiments[{i}] ({exp}); add it to its metrics", {
                        "m": repr(q.metric), "i": e_i, "exp": exp.name})
        return self


def params_key(kind: str, comp: Component) -> tuple[str, str, str]:
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
        key = params_key(kind, comp)
        model = self._validated.get(key)
        if model is None:
            model = self.registry.get(kind, comp.name).validate_params(comp.params)
            self._validated[key] = model
        return model

    def resolved_params(self, kind: str, comp: Component) -> BaseModel:
        """:meth:`validated`, with each declared input path made absolute against
        :attr:`base_dir` (see :mod:`selbench.contract.inputs`): what the plugin is built with."""
        key = params_key(kind, comp)
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
        for key in ("questions", "cost"):  # specs without them keep the hash they had
            if not data.get(key):
                del data[key]
        if data.get("questions", {}).get("hierarchical") == HierarchicalSpec().model_dump():
            del data["questions"]["hierarchical"]  # specs that leave it keep their hash
        for d, exp in zip(data["experiments"], self.spec.experiments):
            if exp.tuning is None:  # untuned specs keep the canonical form they had
                del d["tuning"]
            else:  # tuned ones too: the fields added since only where set
                d["tuning"] = exp.tuning.canonical()
            if d.get("risk_guarantee", 0) is None:  # specs without one keep their hash
                del d["risk_guarantee"]
            for dm in d["methods"]:
                if dm.get("search", 0) is None:
                    del dm["search"]
                if dm.get("tuning", 0) is None:
                    del dm["tuning"]
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

    def method_params(self, method: MethodSpec) -> dict[str, Any]:
        """A method as :class:`~selbench.library.estimator.SelectiveRecalibrator` parameters:
        each component ``{name, params}`` with its validated params (defaults filled in, input
        paths resolved against the spec's folder), absent losses None."""
        params: dict[str, Any] = {attr: None for _, attr in METHOD_FIELDS}
        for kind, attr, comp in method.components():
            params[attr] = {"name": comp.name, "params": self.params(kind, comp)}
        return params

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

