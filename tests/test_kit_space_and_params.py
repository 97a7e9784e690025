"""Issue 36 items 3 and 7: the conformance kit exercises the search space a plugin declares
(not only its defaults), naming the parameter values on a failure, and checks first that
``__init__`` stores its parameters under their own names, so a renamed parameter is one
error naming the rule rather than many downstream ones."""

from __future__ import annotations

from typing import Annotated

import numpy as np
import pytest
from selbench import Recalibrator, Selector
from selbench.contract.search import Tune
from selbench.testing import (
    CheckSkipped,
    ConformanceError,
    all_checks,
    check_plugin,
    plugin_checks,
)
from selbench.testing.space import SPACE_DRAWS, space_points
from selbench.testing.support import resolve_subject

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class NanBins(Recalibrator):
    """The raw confidence, NaN for n_bins >= 20 (an empty bin divided by zero), inside the
    space it declares; every other rule kept."""

    def __init__(self, n_bins: Annotated[int, Tune.int(2, 30)] = 3,
                 smooth: Annotated[float, Tune.log_uniform(0.1, 10.0)] = 1.0):
        self.n_bins = n_bins
        self.smooth = smooth

    def fit(self, outputs, context):
        if not hasattr(outputs, "logits") or len(outputs) == 0:
            raise ValueError("outputs: expected ModelOutputs with at least one row")
        self.fitted_ = True
        return self

    def confidence(self, outputs):
        if not hasattr(outputs, "logits"):
            raise TypeError("outputs: expected ModelOutputs")
        if not getattr(self, "fitted_", False):
            raise ValueError("NanBins is not fitted; call fit first")
        c = outputs.confidence()
        return np.full_like(c, np.nan) if self.n_bins >= 20 else c


def test_kit_fails_a_plugin_that_breaks_inside_its_space_naming_the_values():
    with pytest.raises(ConformanceError) as info:
        check_plugin("recalibrator", NanBins)
    (error,) = info.value.errors  # every other check passes at the defaults
    assert error.check == "check_search_space"
    assert error.detail == ("with n_bins=30 (an end of n_bins's space int[2, 30]): "
                            "confidence(outputs) returned NaN or infinite values (first at "
                            "index 0: nan)")
    check_plugin("recalibrator", NanBins, {"n_bins": 19})  # held below 20: nothing breaks


def test_space_points_are_the_ends_then_seeded_draws():
    subject = resolve_subject("recalibrator", NanBins, {})
    points = space_points(subject)
    assert [p for p, _ in points[:4]] == [{"n_bins": 2}, {"n_bins": 30}, {"smooth": 0.1},
                                         {"smooth": 10.0}]
    draws = [p for p, _ in points[4:]]
    assert len(draws) == SPACE_DRAWS and draws == [p for p, _ in space_points(subject)[4:]]
    assert all(2 <= d["n_bins"] <= 30 and 0.1 <= d["smooth"] <= 10.0 for d in draws)
    assert all(isinstance(d["n_bins"], int) for d in draws)
    # a parameter given in params is held: only the others are explored
    held = space_points(resolve_subject("recalibrator", NanBins, {"n_bins": 4}))
    assert all(set(p) == {"smooth"} for p, _ in held)


def test_search_space_check_applies_only_to_plugins_declaring_one():
    class Plain(Recalibrator):
        def fit(self, outputs, context):
            return self

        def confidence(self, outputs):
            return outputs.confidence()

    assert "check_search_space" in all_checks("recalibrator")
    assert "check_search_space" not in dict(plugin_checks("recalibrator", Plain))
    assert "check_search_space" in dict(plugin_checks("recalibrator", NanBins))
    assert "check_search_space" not in dict(plugin_checks("recalibrator", NanBins,
                                                          {"n_bins": 3, "smooth": 1.0}))


class Renamed(Selector):
    """Stores its parameter ``k`` as ``self.width``: the rule the first check names."""

    def __init__(self, k: int = 3):
        self.width = k

    def fit(self, outputs, confidence, context):
        return self

    def score(self, outputs, confidence):
        return np.asarray(confidence, dtype=np.float64) * self.width


def test_a_renamed_parameter_is_one_error_naming_the_rule():
    with pytest.raises(ConformanceError) as info:
        check_plugin("selector", Renamed)
    (error,) = info.value.errors  # check_base_class runs (and passes); the rest wait
    assert error.check == "check_init_stores_params"
    assert str(error) == (
        "selector Renamed: check_init_stores_params: __init__ argument 'k' is not stored as "
        "self.k (its value is stored as self.width); store each argument unchanged under its "
        "own name (self.k = k), or declare param_attributes = {'k': '<attribute>'}, so that "
        "get_params(), set_params() and sklearn.base.clone can read it back (the other "
        f"{len(dict(plugin_checks('selector', Renamed))) - 2} checks were not run: fix this "
        "first)")
    # as pytest tests (parametrize_with_checks), the other checks skip with the reason
    checks = dict(plugin_checks("selector", Renamed))
    with pytest.raises(CheckSkipped, match="not run while the plugin breaks "
                                           "check_init_stores_params"):
        checks["check_clone"]()


def test_a_parameter_changed_in_init_is_named():
    class Converts(Selector):
        def __init__(self, hidden: list = (4,)):
            self.hidden = list(hidden)  # converted: clone would not rebuild the same

        def fit(self, outputs, confidence, context):
            return self

        def score(self, outputs, confidence):
            return np.asarray(confidence, dtype=np.float64)

    with pytest.raises(ConformanceError, match=r"check_init_stores_params: __init__ stored "
                                               r"hidden=\[4\], but \(4,\) was passed"):
        check_plugin("selector", Converts, checks=["check_init_stores_params"])


def test_param_attributes_declares_a_stored_name():
    class Declared(Renamed):
        param_attributes = {"k": "width"}

    check_plugin("selector", Declared, checks=["check_init_stores_params", "check_clone"])


def test_checks_chosen_without_the_parameter_check_still_name_it():
    with pytest.raises(ConformanceError) as info:
        check_plugin("selector", Renamed, checks=["check_clone", "check_score_output"])
    (error,) = info.value.errors
    assert error.check == "check_init_stores_params"
    assert "'k' is not stored as self.k" in str(error)
    assert str(error).endswith("(the other 2 checks were not run: fix this first)")
