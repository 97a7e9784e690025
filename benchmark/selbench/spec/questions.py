"""The ``questions:`` block of a spec: pairs of methods asked about before any number exists,
answered across the experiments (:mod:`selbench.reporting.questions`)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from selbench.measure import hierarchical as hier
from selbench.measure.metrics import METRICS, unknown_metric

__all__ = ["BestOf", "HierarchicalSpec", "QuestionPair", "QuestionsSpec"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")  # as every spec model (spec/model.py)


class BestOf(_Model):
    """The comparison side of a question that stands for a group of methods: the member with
    the best average rank on the question's metric over the experiments the question enters
    (chosen once, on the same data; see :mod:`selbench.reporting.questions`)."""

    best_of: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)


class QuestionPair(_Model):
    """One pre-registered question: is method ``a`` better than ``b`` (a label, or the best of
    a group of labels) on the questions' metric?"""

    name: str = Field(min_length=1, description="the question, in words")
    a: str = Field(min_length=1, description="a method label")
    b: str | BestOf = Field(description="a method label, or {best_of: [labels]}")

    def labels(self) -> list[str]:
        """Every label the question names: ``a``, then ``b``'s."""
        return [self.a] + ([self.b] if isinstance(self.b, str) else list(self.b.best_of))


class HierarchicalSpec(_Model):
    """How the hierarchical Bayesian model (:mod:`selbench.measure.hierarchical`) is sampled
    for each question: Stan chains, posterior draws per chain, warm-up iterations per chain."""

    chains: int = Field(hier.CHAINS, ge=1, le=16)
    samples: int = Field(hier.NSAMPLES, ge=100, description="posterior draws per chain")
    warmup: int = Field(hier.WARMUP, ge=100, description="warm-up iterations per chain")


class QuestionsSpec(_Model):
    """Questions written in the spec before any number exists, each answered across the
    experiments by a paired test and a Bayesian comparison with a stated ROPE
    (:mod:`selbench.reporting.questions`)."""

    rope: float = Field(ge=0.0, description="region of practical equivalence: differences "
                                            "within ±rope on the metric's scale count as equal")
    metric: str = Field("ece1", description="registry metric with a direction; its AUC over "
                                            "beta where the experiment reports auc")
    alpha: float = Field(0.05, gt=0.0, lt=1.0, description="family-wise level (Holm)")
    pairs: list[QuestionPair] = Field(min_length=1)
    hierarchical: HierarchicalSpec | None = Field(
        default_factory=HierarchicalSpec,
        description="the hierarchical model over experiments and seeds (needs PyStan: "
                    "selbench[stats]); null: not run")

    @field_validator("metric")
    @classmethod
    def _metric(cls, v: str) -> str:
        if v not in METRICS:
            raise PydanticCustomError("unknown_metric", "{msg}", {"msg": unknown_metric(v)})
        if not METRICS[v].marked:
            raise PydanticCustomError(
                "metric_direction", "{name} has no direction (no method can be better); "
                "choose one of {ok}",
                {"name": repr(v), "ok": ", ".join(k for k, m in METRICS.items() if m.marked)})
        return v

    @model_validator(mode="after")
    def _distinct(self) -> QuestionsSpec:
        names = [p.name for p in self.pairs]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise PydanticCustomError("question_twice", "questions named twice: {dup}",
                                      {"dup": ", ".join(map(repr, dup))})
        for i, p in enumerate(self.pairs):
            if p.a in p.labels()[1:]:
                raise PydanticCustomError(
                    "question_self", "pairs[{i}]: {a} is compared with itself", {"i": i,
                                                                                 "a": repr(p.a)})
        return self
