"""The conformance kit (``selbench.testing``) tells a plugin's author precisely what is wrong.

Small reference plugins written as a third party would write them pass every check; each
deliberately broken variant below breaks one rule, and the kit's message names the plugin,
the check and what was expected against what happened. A separate distribution installed
with an entry point is checked by name through the registry.
"""

from __future__ import annotations

import copy
import re
import sys
import textwrap
import types
import warnings

import numpy as np
import pytest
import torch
from conftest import install_distribution
from selbench import (
    CoverageLoss,
    Dataset,
    DifferentiableRecalibrator,
    SelectionLoss,
    Selector,
    SplitData,
    TrainableSelector,
)
from selbench.contract.registry import AUTOLOAD_ENV, PluginError, get_registry
from selbench.testing import (
    CheckSkipped,
    ConformanceError,
    ConformanceWarning,
    all_checks,
    check_plugin,
    make_outputs,
    parametrize_with_checks,
    plugin_checks,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: the data every check uses (documented in selbench.testing): fit on FIT, evaluate on EVAL
FIT, EVAL = make_outputs(120, 3, 6, seed=0), make_outputs(80, 3, 6, seed=1)


# ---------------------------------------------------------------- reference plugins
#: a recalibrator and a selector as a third party writes them, with their helpers: installed
#: as a distribution (``kit_demo_installed``) and loaded below as the module whose
#: ``Shrink`` and helpers the reference plugins here use
PLUGIN_MODULE = '''
import numpy as np
from selbench import Params, Plugin, Recalibrator, Selector, hookimpl
from selbench.contract.data import ModelOutputs
from sklearn.exceptions import NotFittedError


def checked(outputs, min_rows=0):
    if not isinstance(outputs, ModelOutputs):
        raise TypeError(f"outputs: expected selbench.ModelOutputs, got {type(outputs).__name__}")
    if len(outputs) < min_rows:
        raise ValueError(f"outputs: needs at least {min_rows} example(s), got {len(outputs)}")
    return outputs


def fitted(plugin, attribute):
    if not hasattr(plugin, attribute):
        raise NotFittedError(f"{type(plugin).__name__} is not fitted; call fit first")


def checked_confidence(outputs, confidence):
    conf = np.asarray(confidence, dtype=np.float64)
    if conf.shape != (len(outputs),):
        raise ValueError(f"confidence: expected shape ({len(outputs)},), got {conf.shape}")
    return conf


class ShrinkParams(Params):
    factor: float = 0.9


class Shrink(Recalibrator):
    """Shrink the confidence towards 1/K: ``1/K + factor (c - 1/K)``."""

    usable_unfitted = False

    def __init__(self, factor=0.9):
        self.factor = factor

    def fit(self, outputs, context):
        self.k_ = checked(outputs, 1).num_classes
        return self

    def confidence(self, outputs):
        checked(outputs)
        fitted(self, "k_")
        return 1 / self.k_ + self.factor * (outputs.confidence() - 1 / self.k_)

    def predict(self, outputs):
        return checked(outputs).predictions()


class EntropyParams(Params):
    scale: float = 1.0


class Entropy(Selector):
    """Negative entropy of the softmax, standardised on the fitting data."""

    def __init__(self, scale=1.0):
        self.scale = scale

    def _neg_entropy(self, outputs, confidence):
        checked_confidence(checked(outputs), confidence)
        p = outputs.probabilities()
        return (p * np.log(np.clip(p, 1e-12, 1))).sum(axis=1)

    def fit(self, outputs, confidence, context):
        h = self._neg_entropy(checked(outputs, 1), confidence)
        self.mean_, self.std_ = float(h.mean()), float(h.std()) or 1.0
        return self

    def score(self, outputs, confidence):
        h = self._neg_entropy(outputs, confidence)
        fitted(self, "mean_")
        return self.scale * (h - self.mean_) / self.std_


@hookimpl
def selbench_recalibrators():
    return [Plugin("kit-shrink", Shrink, ShrinkParams)]


@hookimpl
def selbench_selectors():
    return [Plugin("kit-entropy", Entropy, EntropyParams)]
'''


def load_module(name, source):
    """``source`` run as the module ``name``, put in ``sys.modules`` (so that its classes
    pickle)."""
    module = types.ModuleType(name)
    sys.modules[name] = module
    exec(compile(textwrap.dedent(source), f"<{name}>", "exec"), module.__dict__)
    return module


demo = load_module("kit_demo_reference", PLUGIN_MODULE)
checked, fitted, checked_confidence = demo.checked, demo.fitted, demo.checked_confidence
Shrink = demo.Shrink


class Margin(Selector):
    """Score: the gap between the two largest logits, in units of its fitted spread."""

    def __init__(self, scale=1.0):
        self.scale = scale

    def gap(self, outputs, confidence):
        checked(outputs)
        checked_confidence(outputs, confidence)
        top = np.sort(outputs.logits.astype(np.float64), axis=1)[:, -2:]
        return top[:, 1] - top[:, 0]

    def fit(self, outputs, confidence, context):
        self.spread_ = float(self.gap(checked(outputs, 1), confidence).std()) or 1.0
        return self

    def score(self, outputs, confidence):
        gap = self.gap(outputs, confidence)
        fitted(self, "spread_")
        return self.scale * gap / self.spread_


class TempModule(torch.nn.Module):
    def __init__(self, t):
        super().__init__()
        self.log_t = torch.nn.Parameter(torch.tensor(float(np.log(t))))

    def forward(self, logits, features=None):
        log_probs = torch.log_softmax(logits / self.log_t.exp(), -1)
        return log_probs.max(-1).values.exp(), log_probs


class Temp(DifferentiableRecalibrator):
    """Softmax of the logits at a fixed temperature, trainable jointly through its module."""

    provides_log_probs = True
    usable_unfitted = False

    def __init__(self, t=1.5):
        self.t = t

    def fit(self, outputs, context):
        checked(outputs, 1)
        self.module_ = TempModule(self.t)
        return self

    def confidence(self, outputs):
        checked(outputs)
        fitted(self, "module_")
        with torch.no_grad():
            return self.module_(torch.tensor(outputs.logits))[0].double().numpy()

    def predict(self, outputs):
        return checked(outputs).predictions()

    def module(self, outputs, context):
        fitted(self, "module_")
        return self.module_


class Gate(torch.nn.Module):
    def __init__(self, d, seed):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.weight = torch.nn.Parameter(torch.randn(d, generator=gen) * 0.1)

    def forward(self, x):
        return torch.sigmoid(x @ self.weight)


class LinearGate(TrainableSelector):
    """A learned soft selector sigmoid(w·x), trained by a scheme."""

    def inputs(self, outputs):
        return np.array(checked(outputs).features, dtype=np.float32)

    def init_module(self, outputs, context):
        self.dim_ = checked(outputs, 1).feature_dim
        self.module_ = Gate(self.dim_, int(context.seed))
        return self.module_

    def fit(self, outputs, confidence, context):
        raise ValueError("LinearGate is trained by the selection, sequential or joint scheme")

    def score(self, outputs, confidence):
        checked_confidence(checked(outputs), confidence)
        fitted(self, "module_")
        if outputs.feature_dim != self.dim_:
            raise ValueError(f"features: fitted on d={self.dim_}, got d={outputs.feature_dim}")
        with torch.no_grad():
            return self.module_(torch.tensor(self.inputs(outputs))).double().numpy()


class AbsLoss(SelectionLoss):
    """Mean of ĝ |correct - confidence|."""

    def __call__(self, g, confidence, correct, label_log_prob=None):
        if confidence.shape != g.shape:
            raise ValueError(f"confidence: expected shape {tuple(g.shape)}, got "
                             f"{tuple(confidence.shape)}")
        return (g * (correct - confidence).abs()).mean(-1)


class Coverage(CoverageLoss):
    """The paper's quadratic coverage loss with lambda = 1."""

    def __call__(self, g, beta):
        return (beta - g.mean(-1)) ** 2


class Tiny(Dataset):
    """Two splits of random vectors and binary labels."""

    num_classes = 2
    input_kind = "vectors"

    def splits(self):
        return ["train", "test"]

    def split(self, name):
        if name not in ("train", "test"):
            raise KeyError(f"no split {name!r}")
        rng = np.random.default_rng(0 if name == "train" else 1)
        x = rng.normal(size=(20, 3))
        return SplitData(inputs=x, labels=(x[:, 0] > 0).astype(np.int64))


REFERENCE = [("recalibrator", Shrink), ("recalibrator", Temp, {"t": 2.0}),
             ("selector", Margin, {"scale": 2.0}), ("selector", LinearGate),
             ("loss", AbsLoss), ("dataset", Tiny)]


# the three lines a third party writes in its CI
@parametrize_with_checks(REFERENCE)
def test_reference_plugins_pass_every_check(check):
    check()


# ---------------------------------------------------------------- broken plugins
def failure(kind, plugin, check, params=None) -> ConformanceError:
    """The kit's error for ``plugin`` when only ``check`` runs."""
    with pytest.raises(ConformanceError) as info:
        check_plugin(kind, plugin, params, checks=[check])
    err = info.value
    assert isinstance(err, AssertionError)
    assert (err.check, len(err.errors)) == (check, 1)
    return err


def test_fit_not_returning_self():
    class FitReturnsNone(Shrink):
        def fit(self, outputs, context):
            super().fit(outputs, context)

    assert str(failure("recalibrator", FitReturnsNone, "check_fit_returns_self")) == (
        "recalibrator FitReturnsNone: check_fit_returns_self: fit(outputs, context) returned "
        "None, expected the recalibrator itself (end fit with `return self`)")


def test_confidence_out_of_range_names_the_value_and_the_row():
    conf = 1 / 3 + 1.5 * (EVAL.confidence() - 1 / 3)
    i = int(np.argmax(conf))
    assert conf[i] > 1
    assert str(failure("recalibrator", Shrink, "check_confidence_output", {"factor": 1.5})) == (
        "recalibrator Shrink(factor=1.5): check_confidence_output: confidence(outputs) returned "
        f"values outside [0, 1] (max {conf[i]:.6g} at index {i})")


class Float32(Shrink):
    def confidence(self, outputs):
        return super().confidence(outputs).astype(np.float32)


class Column(Shrink):
    def confidence(self, outputs):
        return super().confidence(outputs)[:, None]


class WithNaN(Shrink):
    def confidence(self, outputs):
        conf = super().confidence(outputs)
        conf[5] = np.nan
        return conf


class AsList(Shrink):
    def confidence(self, outputs):
        return super().confidence(outputs).tolist()


class ShiftedPrediction(Shrink):
    def predict(self, outputs):
        return super().predict(outputs) + 1


@pytest.mark.parametrize("plugin,check,detail", [
    (Float32, "check_confidence_output",
     "confidence(outputs) returned dtype float32, expected float64"),
    (Column, "check_confidence_output",
     "confidence(outputs) returned shape (80, 1) for 80 examples, expected (80,)"),
    (WithNaN, "check_confidence_output",
     "confidence(outputs) returned NaN or infinite values (first at index 5: nan)"),
    (AsList, "check_confidence_output",
     "confidence(outputs) returned a list, expected a numpy.ndarray of dtype float64 and "
     "shape (80,)"),
    (ShiftedPrediction, "check_predict_output",
     f"predict(outputs) returned classes outside [0, 3) (found 3 at index "
     f"{int(np.flatnonzero(EVAL.predictions() == 2)[0])})"),
])
def test_return_types_shapes_and_ranges(plugin, check, detail):
    err = failure("recalibrator", plugin, check)
    assert str(err) == f"recalibrator {plugin.__name__}: {check}: {detail}"
    assert (err.plugin, err.detail) == (f"recalibrator {plugin.__name__}", detail)


def test_mutating_an_input_names_the_call_the_array_and_the_element():
    class ZeroesLogits(Shrink):
        def fit(self, outputs, context):
            outputs.logits[2, 1] = 0.0
            return super().fit(outputs, context)

    before = FIT.logits[2, 1]
    assert str(failure("recalibrator", ZeroesLogits, "check_does_not_mutate_inputs")) == (
        "recalibrator ZeroesLogits: check_does_not_mutate_inputs: fit(outputs, context) "
        f"modified outputs.logits in place (first at index (2, 1): {before:.6g} vs 0; largest "
        f"difference {abs(before):.6g}, before vs after); copy an array before changing it")


def test_mutating_the_confidence_or_the_context():
    class ClipsConfidence(Margin):
        def score(self, outputs, confidence):
            np.clip(confidence, 0.5, 1.0, out=confidence)
            return super().score(outputs, confidence)

    class BumpsSeed(Margin):
        def fit(self, outputs, confidence, context):
            context.seed += 1
            return super().fit(outputs, confidence, context)

    err = failure("selector", ClipsConfidence, "check_does_not_mutate_inputs")
    assert re.fullmatch(r"selector ClipsConfidence: check_does_not_mutate_inputs: "
                        r"score\(outputs, confidence\) modified confidence in place \(first at "
                        r"index \d+: 0\.\d+ vs 0\.5; .*", str(err))
    assert str(failure("selector", BumpsSeed, "check_does_not_mutate_inputs")) == (
        "selector BumpsSeed: check_does_not_mutate_inputs: fit(outputs, confidence, context) "
        "changed context.seed from 0 to 1")


def test_nondeterministic_fit():
    class Jitter(Shrink):
        def fit(self, outputs, context):
            self.jitter_ = np.random.default_rng().uniform(0.0, 0.01)  # not from context.seed
            return super().fit(outputs, context)

        def confidence(self, outputs):
            return super().confidence(outputs) - self.jitter_

    err = failure("recalibrator", Jitter, "check_fit_is_deterministic")
    assert re.fullmatch(
        r"recalibrator Jitter: check_fit_is_deterministic: two fits with FitContext\(seed=0\) "
        r"on the same outputs gave different confidence\(outputs\) \(first at index 0: \S+ vs "
        r"\S+; largest difference \S+\); seed all randomness from context.seed", str(err))


class KeepsLambda(Shrink):
    def fit(self, outputs, context):
        self.transform_ = lambda c: c
        return super().fit(outputs, context)


class ForgetsFactor(Shrink):
    def __setstate__(self, state):
        self.__dict__.update(state, factor=0.5)


def test_unpicklable_state():
    err = failure("recalibrator", KeepsLambda, "check_pickle")
    assert str(err).startswith("recalibrator KeepsLambda: check_pickle: "
                               "pickle.dumps(<fitted recalibrator>) raised ")
    assert "lambda" in str(err)
    assert err.__cause__ is not None  # the pickling error itself, for the traceback


def test_pickle_round_trip_that_loses_state():
    assert re.fullmatch(r"recalibrator ForgetsFactor: check_pickle: the unpickled copy gave a "
                        r"different confidence\(outputs\) \(first at index 0: .*\)",
                        str(failure("recalibrator", ForgetsFactor, "check_pickle")))


def test_unfitted_use():
    class NoFittedCheck(Shrink):
        def confidence(self, outputs):
            return 1 / self.k_ + self.factor * (outputs.confidence() - 1 / self.k_)

    class ClaimsUsableUnfitted(Shrink):
        usable_unfitted = True

    class ClaimsNotUsable(Shrink):
        def confidence(self, outputs):
            return outputs.confidence()

    assert str(failure("recalibrator", NoFittedCheck, "check_unfitted")) == (
        "recalibrator NoFittedCheck: check_unfitted: confidence(outputs) before fit raised "
        "AttributeError: 'NoFittedCheck' object has no attribute 'k_'; expected "
        "sklearn.exceptions.NotFittedError (or another ValueError) saying it is not fitted")
    err = failure("recalibrator", ClaimsUsableUnfitted, "check_unfitted")
    assert str(err).startswith(
        "recalibrator ClaimsUsableUnfitted: check_unfitted: declares usable_unfitted = True, "
        "but confidence(outputs) before fit raised NotFittedError: ")
    assert str(failure("recalibrator", ClaimsNotUsable, "check_unfitted")) == (
        "recalibrator ClaimsNotUsable: check_unfitted: declares usable_unfitted = False, but "
        "confidence(outputs) before fit returned an ndarray of dtype float64 and shape (80,) "
        "instead of raising sklearn.exceptions.NotFittedError")


def test_bad_input_must_raise_a_clear_error():
    class NoTypeCheck(Shrink):
        def confidence(self, outputs):
            return 1 / self.k_ + self.factor * (outputs.confidence() - 1 / self.k_)

    class VagueEmptyError(Shrink):
        def fit(self, outputs, context):
            if len(outputs) == 0:
                raise ValueError("bad input")
            return super().fit(outputs, context)

    class IgnoresLength(Margin):
        def score(self, outputs, confidence):
            return super().score(outputs, np.resize(confidence, len(outputs)))

    assert str(failure("recalibrator", NoTypeCheck, "check_rejects_non_model_outputs")) == (
        "recalibrator NoTypeCheck: check_rejects_non_model_outputs: confidence(<ndarray>) "
        "raised AttributeError: 'numpy.ndarray' object has no attribute 'confidence'; "
        "expected a TypeError or ValueError whose message names 'outputs'")
    assert str(failure("recalibrator", VagueEmptyError, "check_rejects_empty_outputs")) == (
        "recalibrator VagueEmptyError: check_rejects_empty_outputs: fit(<outputs with 0 rows>, "
        "context) raised ValueError('bad input'), whose message does not name the bad argument "
        "('outputs')")
    assert str(failure("selector", IgnoresLength, "check_rejects_confidence_of_wrong_length")) \
        == ("selector IgnoresLength: check_rejects_confidence_of_wrong_length: score(outputs, "
            "<confidence of length 79>) for 80 rows returned an ndarray of dtype float64 and "
            "shape (80,) instead of raising a ValueError whose message names 'confidence'")


def test_features_of_another_width():
    class Projection(Margin):
        def fit(self, outputs, confidence, context):
            self.w_ = np.ones(outputs.feature_dim)
            return super().fit(outputs, confidence, context)

        def score(self, outputs, confidence):
            return super().score(outputs, confidence) + outputs.features @ self.w_

    class Pads(Projection):
        def score(self, outputs, confidence):
            x = outputs.features  # silently padded with zeros to the fitted width
            x = np.pad(x, ((0, 0), (0, len(self.w_) - x.shape[1])))
            return Margin.score(self, outputs, confidence) + x @ self.w_

    err = failure("selector", Projection, "check_rejects_other_feature_width")
    assert str(err).startswith(
        "selector Projection: check_rejects_other_feature_width: score(<outputs with d=5 "
        "features>) after fitting on d=6 raised ValueError('matmul: ")
    assert str(err).endswith("whose message does not name 'features'")
    assert str(failure("selector", Pads, "check_rejects_other_feature_width")).startswith(
        "selector Pads: check_rejects_other_feature_width: score(<outputs with d=5 "
        "features>) after fitting on d=6 neither raised a ValueError naming 'features' nor "
        "ignored the features (first at index 0: ")


def test_outputs_that_depend_on_the_batch():
    class Centred(Margin):
        def score(self, outputs, confidence):
            score = super().score(outputs, confidence)
            return score - score.mean()

    err = failure("selector", Centred, "check_outputs_are_per_example")
    assert re.fullmatch(
        r"selector Centred: check_outputs_are_per_example: score\(outputs, confidence\) on a "
        r"shuffled half of the rows is not those rows' values on all of them \(first at index "
        r"0: .*, all rows vs the half\); an example's output must depend on that example only",
        str(err))


def test_clone_and_parameters():
    class NotAnEstimator:  # Shrink without its base class, so without get_params
        usable_unfitted = False
        __init__, fit = Shrink.__init__, Shrink.fit
        confidence, predict = Shrink.confidence, Shrink.predict

    class ScalesFactor(Shrink):
        def __init__(self, factor=0.9):
            self.factor = factor * 1.0

    class IgnoresFactor(Shrink):
        def __init__(self, factor=0.9):
            self.factor = 0.5

    err = failure("recalibrator", NotAnEstimator, "check_clone")
    assert str(err).startswith(
        "recalibrator NotAnEstimator: check_clone: sklearn.base.clone(<fitted recalibrator>) "
        "raised TypeError: Cannot clone object")
    assert str(err).endswith(
        "; make the plugin a scikit-learn estimator: derive from its kind's selbench base "
        "class (selbench.Recalibrator), which provides get_params and set_params, and store "
        "every __init__ argument unchanged under its own name")
    err = failure("recalibrator", ScalesFactor, "check_clone")
    assert "raised RuntimeError" in str(err) and "factor" in str(err)
    assert str(err).endswith("; __init__ must store every argument unchanged under its own "
                             "name")
    assert str(failure("recalibrator", IgnoresFactor, "check_clone", {"factor": 0.8})) == (
        "recalibrator IgnoresFactor(factor=0.8): check_clone: get_params()['factor'] is 0.5, "
        "but the plugin was built with factor=0.8")


def test_module_protocol():
    class CopiesModule(Temp):
        def module(self, outputs, context):
            return copy.deepcopy(super().module(outputs, context))

    class ReadsAFrozenCopy(Temp):
        def fit(self, outputs, context):
            super().fit(outputs, context)
            self.frozen_ = copy.deepcopy(self.module_)
            return self

        def confidence(self, outputs):
            with torch.no_grad():
                return self.frozen_(torch.tensor(checked(outputs).logits))[0].double().numpy()

    class NoLogProbs(Temp):
        def module(self, outputs, context):
            module = super().module(outputs, context)
            module.forward = lambda logits, features=None: (TempModule.forward(
                module, logits, features)[0], None)
            return module

    assert str(failure("recalibrator", CopiesModule, "check_module_protocol")) == (
        "recalibrator CopiesModule: check_module_protocol: module(outputs, context) returned a "
        "new object on a second call; it must return the recalibrator's own live module, not "
        "a copy")
    assert str(failure("recalibrator", ReadsAFrozenCopy, "check_module_protocol")).startswith(
        "recalibrator ReadsAFrozenCopy: check_module_protocol: after the module's parameters "
        "were changed in place, confidence(outputs) did not follow (first at index 0: ")
    assert str(failure("recalibrator", NoLogProbs, "check_module_protocol")) == (
        "recalibrator NoLogProbs: check_module_protocol: declares provides_log_probs = True, "
        "but the module returned log_probs None")


def test_fit_many_must_equal_fit_and_give_each_job_its_own_state():
    class Offset(Shrink):
        """Subtracts a small seeded offset (as a random initialisation would)."""

        def fit(self, outputs, context):
            self.offset_ = np.array([0.01 * context.generator().random()])
            return super().fit(outputs, context)

        def confidence(self, outputs):
            return super().confidence(outputs) - self.offset_[0]

    class FirstSeedOnly(Offset):
        @classmethod
        def fit_many(cls, recalibrators, outputs, contexts):
            for rec, out in zip(recalibrators, outputs):
                rec.fit(out, contexts[0])

    class SharesState(Offset):
        @classmethod
        def fit_many(cls, recalibrators, outputs, contexts):
            for rec, out, ctx in zip(recalibrators, outputs, contexts):
                rec.fit(out, ctx)
            recalibrators[1].offset_ = recalibrators[0].offset_  # same seed and data: "copied"

    check_plugin("recalibrator", Offset, checks=["check_fit_many_equals_fit"])
    err = failure("recalibrator", FirstSeedOnly, "check_fit_many_equals_fit")
    assert re.fullmatch(
        r"recalibrator FirstSeedOnly: check_fit_many_equals_fit: scheme 'recalibration': "
        r"replica 2 \(seed 1, beta 0.6\) fitted by fit_many gives a different recalibrator "
        r"confidence than fitted alone by fit \(first at index 0: .*; tolerance 1e-05\); "
        r"fit_many must leave every replica as its own fit would", str(err))
    assert str(failure("recalibrator", SharesState, "check_fit_many_equals_fit")) == (
        "recalibrator SharesState: check_fit_many_equals_fit: fit_many left the recalibrators "
        "of jobs 0 and 1 sharing the learned attribute offset_ (one object); each job's "
        "recalibrator must own its state (copy it, e.g. copy.deepcopy)")


def test_trainable_selector_protocol():
    class ForgetsModule(LinearGate):
        def init_module(self, outputs, context):
            module = super().init_module(outputs, context)
            del self.module_
            return module

    class UnseededInit(LinearGate):
        def init_module(self, outputs, context):
            self.dim_ = outputs.feature_dim
            self.module_ = Gate(self.dim_, int(torch.randint(0, 2**31, ())))
            return self.module_

    assert str(failure("selector", ForgetsModule, "check_trainable_protocol")) == (
        "selector ForgetsModule: check_trainable_protocol: init_module(outputs, context) did "
        "not store the module it returned as module_ (score() reads the trained module from "
        "there)")
    assert str(failure("selector", UnseededInit, "check_trainable_protocol")) == (
        "selector UnseededInit: check_trainable_protocol: two init_module calls with "
        "FitContext(seed=0) gave different initial weights (weight); seed them from "
        "context.seed")


def test_losses():
    class ReturnsFloat(AbsLoss):
        def __call__(self, *args, **kwargs):
            return float(super().__call__(*args, **kwargs).detach())

    class Detached(AbsLoss):
        def __call__(self, *args, **kwargs):
            return super().__call__(*args, **kwargs).detach()

    class NoShapeCheck(AbsLoss):
        def __call__(self, g, confidence, correct, label_log_prob=None):
            return (g[: len(confidence)] * (correct[: len(confidence)] - confidence)).mean()

    class WholeMean(AbsLoss):  # reduces over the replicas too
        def __call__(self, g, confidence, correct, label_log_prob=None):
            return super().__call__(g, confidence, correct).mean()

    what = "loss(g, confidence, correct, label_log_prob)"
    assert str(failure("loss", ReturnsFloat, "check_loss_value")) == (
        f"loss ReturnsFloat: check_loss_value: {what} returned a float, expected a torch.Tensor")
    assert str(failure("loss", Detached, "check_loss_value")) == (
        f"loss Detached: check_loss_value: {what} is not differentiable (its result does not "
        "require grad)")
    assert str(failure("loss", NoShapeCheck, "check_loss_rejects_mismatched_shapes")) == (
        "loss NoShapeCheck: check_loss_rejects_mismatched_shapes: loss(g [24], <confidence "
        "[23]>, correct [24]) returned a Tensor instead of raising a ValueError whose message "
        "names 'confidence'")
    assert str(failure("loss", WholeMean, "check_loss_replica_rows")) == (
        "loss WholeMean: check_loss_replica_rows: loss(g [R, B], confidence [R, B], correct "
        "[R, B], label_log_prob [R, B]) returned a Tensor, expected a tensor of shape (3,): "
        "reduce over the last dimension only (e.g. .mean(-1))")
    check_plugin("loss", Coverage)
    assert "check_loss_rejects_mismatched_shapes" not in dict(plugin_checks("loss", Coverage))


def test_datasets():
    class LabelOutOfRange(Tiny):
        def split(self, name):
            data = super().split(name)
            data.labels[3] = 2
            return data

    class AcceptsAnyName(Tiny):
        def split(self, name):
            return super().split("train")

    class Missing(Tiny):
        def splits(self):
            raise FileNotFoundError("data/tiny.npz does not exist; download it from ...")

    assert str(failure("dataset", LabelOutOfRange, "check_dataset_split_contract")) == (
        "dataset LabelOutOfRange: check_dataset_split_contract: split('train').labels "
        "returned classes outside [0, 2) (found 2 at index 3)")
    assert str(failure("dataset", AcceptsAnyName, "check_dataset_rejects_unknown_split")) == (
        "dataset AcceptsAnyName: check_dataset_rejects_unknown_split: split('no-such-split') "
        "returned a SplitData instead of raising a KeyError or ValueError")
    with pytest.warns(ConformanceWarning) as record:
        check_plugin("dataset", Missing)  # nothing can be checked: skipped with the reason
    assert [str(w.message) for w in record] == [
        f"dataset Missing: {check}: skipped: data not available: FileNotFoundError: "
        "data/tiny.npz does not exist; download it from ..."
        for check in ("check_dataset_splits", "check_dataset_split_contract",
                      "check_dataset_is_deterministic", "check_dataset_rejects_unknown_split")]
    check = dict(plugin_checks("dataset", Missing))["check_dataset_splits"]
    with pytest.raises(CheckSkipped, match="data not available"):
        check()


def test_shardable_backbones_must_honour_rows():
    """A backbone declaring ``shardable`` must return exactly the asked rows of the split,
    with the whole split's meta; the built-in theory-linear passes."""
    import dataclasses

    from selbench_plugins.backbones.linear import TheoryLinear

    check_plugin("backbone", "theory-linear", checks=["check_backbone_rows"])

    class IgnoresRows(TheoryLinear):
        def extract(self, dataset, split, context):
            return super().extract(dataset, split, dataclasses.replace(context, rows=None))

    class RowMeta(TheoryLinear):
        def extract(self, dataset, split, context):
            out = super().extract(dataset, split, context)
            out.meta["rows"] = list(context.rows or ())
            return out

    class NotDeclared(IgnoresRows):
        shardable = False

    assert str(failure("backbone", IgnoresRows, "check_backbone_rows")) == (
        "backbone IgnoresRows: check_backbone_rows: it declares shardable, but "
        "extract(dataset, 'test', context) with FitContext.rows=(0, 10) returned 30 rows, "
        "expected 10")
    assert "meta differ from the whole split's meta" in str(
        failure("backbone", RowMeta, "check_backbone_rows"))
    check = dict(plugin_checks("backbone", NotDeclared))["check_backbone_rows"]
    with pytest.raises(CheckSkipped, match="does not declare shardable"):
        check()


def test_text_backbones_are_checked_on_synthetic_sentences():
    """The kit synthesises ``text`` inputs (binary reviews); an ``extract`` that needs an
    optional package that is not installed skips the checks with the reason."""
    from selbench import Backbone, FitContext
    from selbench.contract.data import ModelOutputs

    class Counts(Backbone):  # features: characters and words; logits from "awful" / "a"
        input_kinds = frozenset({"text"})

        def extract(self, dataset, split, context: FitContext):
            data = dataset.split(split)
            x = np.array([[len(s), len(s.split())] for s in data.inputs], dtype=np.float32)
            bad = np.array([("awful" in s) + ("dreadful" in s) for s in data.inputs], float)
            return ModelOutputs(features=x, logits=np.stack([bad, -bad], 1),
                                labels=data.labels, domain=data.domain)

    class NotInstalled(Counts):
        def extract(self, dataset, split, context):
            raise ModuleNotFoundError("needs 'sentence-transformers'; pip install it")

    check_plugin("backbone", Counts, checks=["check_backbone_extract",
                                             "check_backbone_is_deterministic"])
    with pytest.warns(ConformanceWarning) as record:
        check_plugin("backbone", NotInstalled, checks=["check_backbone_extract"])
    assert [str(w.message) for w in record] == [
        "backbone NotInstalled: check_backbone_extract: skipped: extract(dataset, 'train', "
        "context) needs what is not installed: ModuleNotFoundError: needs "
        "'sentence-transformers'; pip install it"]


def test_base_class_and_construction():
    class Plain:
        def fit(self, outputs, context):
            return self

        def confidence(self, outputs):
            return outputs.confidence()

    def boom():
        raise RuntimeError("boom")

    assert str(failure("recalibrator", Plain, "check_base_class")) == (
        "recalibrator Plain: check_base_class: the factory built a Plain, expected an instance "
        "of selbench.Recalibrator")
    checks = dict(plugin_checks("recalibrator", boom))
    assert list(checks) == ["check_base_class"]
    with pytest.raises(ConformanceError) as info:
        check_plugin("recalibrator", boom)
    assert str(info.value) == ("recalibrator boom: check_base_class: building the plugin raised "
                               "RuntimeError: boom")


class TwoBugs(Float32):
    def fit(self, outputs, context):
        super().fit(outputs, context)


def test_several_broken_rules_are_reported_together():
    with pytest.raises(ConformanceError) as info:
        check_plugin("recalibrator", TwoBugs)
    err = info.value
    assert err.check is None
    assert [e.check for e in err.errors] == ["check_fit_returns_self", "check_confidence_output"]
    lines = str(err).splitlines()
    assert re.fullmatch(r"recalibrator TwoBugs: broke 2 of \d+ checks:", lines[0])
    assert lines[1:] == [f"  {e}" for e in err.errors]


def test_selector_fit_many_must_equal_fit():
    """A non-trainable selector's Selector.fit_many (the recalibration scheme's path) is
    checked against one fit per replica, as a recalibrator's."""

    class FirstDataOnly(Margin):  # "equal data fitted once" without comparing the data
        @classmethod
        def fit_many(cls, selectors, outputs, confidences, contexts):
            selectors[0].fit(outputs[0], confidences[0], contexts[0])
            for sel in selectors[1:]:
                sel.spread_ = selectors[0].spread_

    check_plugin("selector", Margin, checks=["check_fit_many_equals_fit"])
    err = failure("selector", FirstDataOnly, "check_fit_many_equals_fit")
    assert re.fullmatch(
        r"selector FirstDataOnly: check_fit_many_equals_fit: scheme 'recalibration': "
        r"replica 2 \(seed 1, beta 0.6\) fitted by fit_many gives a different selector "
        r"score than fitted alone by fit \(.*\); "
        r"fit_many must leave every replica as its own fit would", str(err))


# ---------------------------------------------------------------- the API
def test_which_checks_apply():
    shrink, temp = dict(plugin_checks("recalibrator", Shrink)), dict(
        plugin_checks("recalibrator", Temp))
    assert set(temp) - set(shrink) == {"check_module_protocol",
                                       "check_joint_fit_many_equals_fit"}
    margin, gate = dict(plugin_checks("selector", Margin)), dict(
        plugin_checks("selector", LinearGate))
    assert set(gate) - set(margin) == {"check_trainable_protocol"}
    assert "check_fit_many_equals_fit" in margin  # every selector: Selector.fit_many
    assert set(margin) - set(gate) == {"check_fit_returns_self"}
    assert set(shrink) <= set(all_checks("recalibrator"))
    assert all(all_checks("selector").values())  # every check states its rule
    assert all_checks("recalibrator")["check_confidence_output"].startswith(
        "``confidence(outputs)`` is a float64 numpy array of shape ``[N]``")


def test_plugins_by_name_by_instance_and_bad_arguments():
    check_plugin("recalibrator", "temperature", checks=["check_confidence_output"])
    check_plugin("recalibrator", Shrink(factor=0.5), skip=["check_clone"])
    with pytest.raises(ValueError, match="unknown recalibrator check 'check_nope'"):
        check_plugin("recalibrator", Shrink, checks=["check_nope"])
    with pytest.raises(ValueError, match="'check_module_protocol' does not apply to "
                                         "recalibrator Shrink: it is not differentiable"):
        check_plugin("recalibrator", Shrink, checks=["check_module_protocol"])
    with pytest.raises(ValueError, match="params: give params with a plugin's name"):
        check_plugin("recalibrator", Shrink(), {"factor": 0.5})
    with pytest.raises(ValueError, match="kind: expected one of"):
        check_plugin("calibrator", Shrink)
    with pytest.raises(PluginError, match="unknown recalibrator 'temprature'; did you mean "
                                          "'temperature'"):
        check_plugin("recalibrator", "temprature")


def test_check_plugin_says_what_passed_unless_quiet(capsys):
    """Success is one line on stdout naming the plugin and how many checks ran; ``quiet``
    prints nothing; a check that cannot run is counted as skipped, not as passed."""
    n = len(list(plugin_checks("recalibrator", Shrink(factor=0.5))))
    check_plugin("recalibrator", Shrink(factor=0.5))
    assert capsys.readouterr().out == f"recalibrator Shrink instance: {n} checks passed\n"
    check_plugin("recalibrator", "temperature", checks=["check_confidence_output"])
    assert capsys.readouterr().out == "recalibrator 'temperature': 1 check passed\n"
    check_plugin("recalibrator", Shrink(factor=0.5), quiet=True)
    assert capsys.readouterr().out == ""

    class Missing(Tiny):
        def splits(self):
            raise FileNotFoundError("data/tiny.npz does not exist")

    # the parameter rule, built, and 4 that read data
    assert len(list(plugin_checks("dataset", Missing))) == 6
    with pytest.warns(ConformanceWarning):
        check_plugin("dataset", Missing)
    assert capsys.readouterr().out == "dataset Missing: 2 checks passed (4 skipped)\n"
    with pytest.raises(ConformanceError):
        check_plugin("recalibrator", Shrink, {"factor": 1.5})
    assert capsys.readouterr().out == ""  # a failure raises, and says nothing of success


def test_parametrize_ids_and_expected_failures():
    decorator = parametrize_with_checks(
        [("recalibrator", Float32), ("selector", Margin, {"scale": 2.0})],
        expected_failures={"check_confidence_output": "float32 on purpose",
                           "selector-Margin(scale=2.0)-check_pickle": "just testing"})
    name, params = decorator.args
    assert name == "check"
    ids = [p.id for p in params]
    assert "recalibrator-Float32-check_confidence_output" in ids
    assert "selector-Margin(scale=2.0)-check_fit_returns_self" in ids
    marked = {p.id: p.marks[0].kwargs for p in params if p.marks}
    assert marked == {
        "recalibrator-Float32-check_confidence_output": {
            "reason": "float32 on purpose", "strict": False, "raises": ConformanceError},
        "selector-Margin(scale=2.0)-check_pickle": {
            "reason": "just testing", "strict": False, "raises": ConformanceError}}
    with pytest.raises(ValueError, match=r"expected \(kind, plugin\) or"):
        parametrize_with_checks([("recalibrator",)])


def test_make_outputs_is_deterministic_and_valid():
    a, b = make_outputs(50, 4, 3, seed=7), make_outputs(50, 4, 3, seed=7)
    for name in ("features", "logits", "labels", "domain"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert (a.features.dtype, a.logits.shape, a.labels.max() < 4) == (np.float32, (50, 4), True)
    assert a.domain.sum() == 50 // 3
    assert make_outputs(10, domain=False).domain is None
    assert not np.array_equal(make_outputs(seed=1).logits, make_outputs(seed=2).logits)


# ---------------------------------------------------------------- a third-party distribution
@pytest.fixture
def kit_demo_installed(tmp_path, monkeypatch):
    """A separate distribution providing a recalibrator and a selector through the
    ``selbench`` entry-point group, on ``sys.path``; the registry is refreshed around it."""
    install_distribution(tmp_path, "kit-demo-plugins", "0.3",
                         {"kit_demo_plugins": textwrap.dedent(PLUGIN_MODULE)})
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    get_registry(refresh=True)
    yield
    monkeypatch.undo()
    sys.modules.pop("kit_demo_plugins", None)
    get_registry(refresh=True)


def test_the_kit_checks_an_installed_distribution_by_name(kit_demo_installed):
    registry = get_registry()
    assert registry.get("recalibrator", "kit-shrink").distribution == "kit-demo-plugins"
    assert registry.get("selector", "kit-entropy").distribution == "kit-demo-plugins"
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConformanceWarning)  # nothing was skipped
        check_plugin("recalibrator", "kit-shrink")
        check_plugin("selector", "kit-entropy", {"scale": 2.0})
    # the same plugin with params that break a rule: the message names it as registered
    with pytest.raises(ConformanceError, match=r"^recalibrator 'kit-shrink': "
                       r"check_confidence_output: confidence\(outputs\) returned values outside "
                       r"\[0, 1\] \(max 1\.\d+ at index \d+\)$"):
        check_plugin("recalibrator", "kit-shrink", {"factor": 1.5},
                     checks=["check_confidence_output"])
    ids = [p.id for p in parametrize_with_checks([("selector", "kit-entropy")]).args[1]]
    assert "selector-kit-entropy-check_clone" in ids
