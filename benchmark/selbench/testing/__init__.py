"""The plugin conformance kit: run every rule of the plugin contract against a plugin.

:func:`check_plugin` runs every check that applies to a plugin and raises one
:class:`ConformanceError` naming the plugin, each broken rule and exactly what was expected
and what the plugin did::

    from selbench.testing import check_plugin

    check_plugin("recalibrator", Shrink, {"factor": 1.5})
    # ConformanceError: recalibrator Shrink(factor=1.5): check_confidence_output:
    #   confidence(outputs) returned values outside [0, 1] (max 1.33333 at index 68)

The kit needs no pytest: :func:`check_plugin`, :func:`plugin_checks` and every ``check_*``
function run in a plain Python process (selbench's first install has no pytest). In a test
suite, :func:`parametrize_with_checks` makes one pytest test per check; it is the only name
that needs pytest, which it imports only when it is called (and a :class:`Check` only to turn
a skipped check into a pytest skip, for :func:`parametrize_with_checks`)::

    from selbench.testing import parametrize_with_checks

    @parametrize_with_checks([("recalibrator", Shrink), ("selector", "my-selector", {"k": 3})])
    def test_my_plugins(check):
        check()

A plugin is given as its registered name (looked up in :func:`selbench.contract.registry.get_registry`,
its params validated by its own model), a :class:`selbench.Plugin` descriptor, a factory
(the class, called as ``factory(**params)``) or an unfitted instance (deep-copied for every
use). Every check builds fresh plugins, so one check never sees another's state.

What is checked (each check's docstring states its rule; :func:`plugin_checks` lists the
checks that apply to a plugin):

* **selector**, **recalibrator**: the kind's base class; ``fit`` returns ``self``; a fit is
  deterministic for a fixed ``FitContext(seed=...)``; nothing mutates its inputs (the
  ``ModelOutputs`` arrays, the confidence array, the context); dtype, shape and range of every
  return (``confidence`` float64 ``[N]`` in [0, 1], ``predict`` int64 ``[N]`` in [0, K),
  ``score`` float64 ``[N]`` finite); each example's output depends on that example only;
  unfitted use raises a ``ValueError`` (scikit-learn's ``NotFittedError`` is one) unless the
  plugin works unfitted; bad input (not ``ModelOutputs``, no rows, confidence of the wrong
  length, features of another width) raises a ``ValueError`` / ``TypeError`` naming the
  argument; ``sklearn.base.clone`` and a pickle round trip; for every selector and
  recalibrator, ``Scheme.fit_many`` over several replicas equals ``Scheme.fit`` of each;
  for differentiable recalibrators the module protocol and joint training.
* **loss** (selection and coverage losses): a finite scalar tensor, differentiable in ĝ (and
  in the confidence, or the log-probabilities for a loss that ``needs_log_probs``),
  deterministic, inputs untouched, shape errors, replica rows (``[R, B]`` gives each row's
  own value, as the training engine calls it), clone and pickle.
* **scheme**: fitted with built-in companions chosen from its declared capabilities
  (selector ``mlp`` or ``confidence``, recalibrator ``temperature`` or ``none``, loss
  ``s-tlbce``, coverage ``quadratic``): ``fit`` returns ``self``, determinism, inputs untouched,
  ``fit_many`` equals ``fit``, clone and pickle.
* **dataset**: the split contract (labels, inputs of the declared input kind, domain),
  determinism, unknown split names. Checks of a dataset whose files are absent (it raises
  ``FileNotFoundError``, as documented) are skipped.
* **backbone**: ``extract`` on a tiny synthetic dataset of an input kind it declares
  (``vectors``, ``image-array`` or ``text``; other kinds are skipped, and so are checks
  whose ``extract`` needs an optional package that is not installed) returns matching
  ``ModelOutputs``, deterministically; a backbone declaring ``shardable`` returns, for row ranges of a split,
  exactly those rows of the whole split with the whole split's ``meta``.

The data are tiny and deterministic: plugins are fitted on ``make_outputs(120, 3, 6,
seed=0)`` and evaluated on ``make_outputs(80, 3, 6, seed=1)`` (binary checks: seeds 2 and 3,
K=2), with ``FitContext(seed=0, beta=0.8)``, on the CPU. Trainable components are trained a
few epochs by the built-in schemes; pass small training params for plugins whose defaults
train long (e.g. ``{"epochs": 20}``).

The kit is a package: the errors (``testing/errors.py``); what every check stands on, the data,
messages, the plugin under test and the check registry (``testing/support.py``); the checks,
one module per kind (``testing/common.py`` for those every fitted kind shares, with clone and
pickle; ``trainable.py``, ``losses.py``, ``schemes.py``, ``datasets.py``, ``backbones.py``);
and here the entry points. Every name is importable from ``selbench.testing``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from selbench.contract.api import KINDS

from .errors import Broken, CheckSkipped, ConformanceError, ConformanceWarning
from .support import (  # noqa: F401  (FIT_MANY_TOL, FLOAT_TOL, N_*, K, D: re-exported)
    FIT_MANY_TOL,
    FLOAT_TOL,
    N_EVAL,
    N_FIT,
    REGISTRY,
    CheckSpec,
    D,
    K,
    Subject,
    fmt_exc,
    make_outputs,
    resolve_subject,
)

# The kind modules register their checks when imported, in the order below, which is the
# order of all_checks() and of test ids: keep it, and keep the kind modules from importing
# one another. Every check is re-exported: users may call a check_* function directly.
# isort: off
from .common import (  # noqa: F401
    check_base_class,
    check_fit_returns_self,
    check_fit_is_deterministic,
    check_does_not_mutate_inputs,
    check_confidence_output,
    check_predict_output,
    check_score_output,
    check_outputs_are_per_example,
    check_unfitted,
    check_rejects_non_model_outputs,
    check_predict_rejects_non_model_outputs,
    check_rejects_empty_outputs,
    check_rejects_confidence_of_wrong_length,
    check_rejects_other_feature_width,
    check_clone,
    check_pickle,
)
from .trainable import (  # noqa: F401
    check_trainable_protocol,
    check_fit_many_equals_fit,
    check_joint_fit_many_equals_fit,
    check_module_protocol,
)
from .losses import (  # noqa: F401
    check_loss_value,
    check_loss_is_deterministic,
    check_loss_rejects_mismatched_shapes,
    check_loss_replica_rows,
)
from .schemes import (  # noqa: F401
    check_scheme_fit_returns_self,
    check_scheme_is_deterministic,
    check_scheme_does_not_mutate_inputs,
    check_scheme_fit_many_equals_fit,
)
from .datasets import (  # noqa: F401
    check_dataset_splits,
    check_dataset_split_contract,
    check_dataset_is_deterministic,
    check_dataset_rejects_unknown_split,
)
from .backbones import (  # noqa: F401
    SYNTHETIC_INPUT_KINDS,
    check_backbone_extract,
    check_backbone_is_deterministic,
    check_backbone_rows,
)
# isort: on

__all__ = [
    "Check",
    "CheckSkipped",
    "ConformanceError",
    "ConformanceWarning",
    "all_checks",
    "check_plugin",
    "make_outputs",
    "parametrize_with_checks",
    "plugin_checks",
]


class Check:
    """One check of one plugin: call it to run it.

    Raises :class:`ConformanceError` when the plugin breaks the check's rule and
    :class:`CheckSkipped` when it cannot run (:func:`parametrize_with_checks` turns that into
    a pytest skip). Attributes: ``kind``, ``plugin`` (as in messages), ``name`` (the check's),
    ``rule`` (what it requires) and ``id`` (``kind-plugin-check``, for test ids).
    """

    def __init__(self, subject: Subject, spec: CheckSpec | None, *, failure: str | None = None,
                 pytest_skip: bool = False):
        self._subject, self._spec, self._failure = subject, spec, failure
        self._pytest_skip = pytest_skip
        self.kind = subject.kind
        self.plugin = subject.label
        self.name = spec.name if spec is not None else "check_base_class"
        self.rule = spec.rule if spec is not None else "the plugin can be built"
        self.id = f"{subject.kind}-{subject.ident}-{self.name}"

    def __repr__(self) -> str:
        return f"<Check {self.id}>"

    def __call__(self) -> None:
        try:
            if self._failure is not None:
                raise Broken(self._failure)
            self._spec.fn(self._subject)
        except Broken as exc:
            raise ConformanceError(self.plugin, self.name, str(exc)) from exc.__cause__
        except SystemExit as exc:  # the plugin ended the process: a broken rule, named
            raise ConformanceError(self.plugin, self.name,
                                   f"the plugin called sys.exit({exc.code!r})") from exc
        except CheckSkipped as exc:
            if self._pytest_skip:
                import pytest

                pytest.skip(f"{self.plugin}: {self.name}: {exc}")
            raise


def all_checks(kind: str) -> dict[str, str]:
    """Every check of ``kind`` (whether or not it applies to a given plugin) -> its rule."""
    if kind not in KINDS:
        raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    return {spec.name: spec.rule for spec in REGISTRY if kind in spec.kinds}


def _specs(subject: Subject) -> list[tuple[CheckSpec, str | None]]:
    """Every check of the subject's kind with None (applies) or why it does not."""
    return [(spec, spec.applies(subject) if subject.probe is not None else None)
            for spec in REGISTRY if subject.kind in spec.kinds]


def plugin_checks(kind: str, plugin: Any, params: Mapping[str, Any] | None = None,
                  ) -> Iterator[tuple[str, Check]]:
    """Yield ``(check name, check)`` for every check that applies to ``plugin``.

    ``plugin`` is a registered name, a :class:`selbench.Plugin`, a factory (class) called as
    ``factory(**params)``, or an unfitted instance (then ``params`` must be empty). A check
    is a :class:`Check`: call it to run it. A plugin that cannot be built yields one failing
    ``check_base_class``. Unknown kinds and names raise ``ValueError`` /
    :class:`selbench.contract.registry.PluginError` here, before anything runs.
    """
    yield from ((c.name, c) for c in _checks(kind, plugin, params))


def _checks(kind: str, plugin: Any, params: Mapping[str, Any] | None, *,
            pytest_skip: bool = False) -> list[Check]:
    subject = resolve_subject(kind, plugin, params)
    try:
        subject.probe = subject.factory()
    except FileNotFoundError as exc:
        if kind not in ("dataset", "backbone"):  # their checks skip: data not available
            return [Check(subject, None, failure=f"building the plugin raised {fmt_exc(exc)}",
                          pytest_skip=pytest_skip)]
    except Exception as exc:
        return [Check(subject, None, failure=f"building the plugin raised {fmt_exc(exc)}",
                      pytest_skip=pytest_skip)]
    except SystemExit as exc:
        return [Check(subject, None, failure=f"building the plugin called sys.exit({exc.code!r})",
                      pytest_skip=pytest_skip)]
    return [Check(subject, spec, pytest_skip=pytest_skip)
            for spec, why_not in _specs(subject) if why_not is None]


def check_plugin(kind: str, plugin: Any, params: Mapping[str, Any] | None = None, *,
                 checks: Iterable[str] | None = None, skip: Iterable[str] = (),
                 quiet: bool = False) -> None:
    """Run every check that applies to ``plugin`` (see :func:`plugin_checks` for what
    ``plugin`` may be) and raise one :class:`ConformanceError` listing each broken rule.

    Args:
        kind: ``selector``, ``recalibrator``, ``loss``, ``scheme``, ``dataset`` or
            ``backbone``.
        plugin: a registered name, a :class:`selbench.Plugin`, a factory or an instance.
        params: keyword arguments of the factory (validated by the plugin's params model
            when ``plugin`` is a name or a :class:`selbench.Plugin`).
        checks: run only these checks (names as in :func:`all_checks`).
        skip: do not run these checks.
        quiet: print nothing on success; by default one line on stdout says what passed
            (``recalibrator 'shrink': 23 checks passed``, with the skipped ones counted).

    Raises:
        ConformanceError: an ``AssertionError`` naming the plugin, every failed check and
            what was expected vs what happened (one line each).
        ValueError: unknown kind or check name, or a named check that does not apply.

    Checks that cannot run (a dataset's files are absent) are reported as
    :class:`ConformanceWarning` warnings. Needs no pytest.
    """
    found = _checks(kind, plugin, params)
    known = all_checks(kind)
    wanted = None if checks is None else list(checks)
    skip = list(skip)
    for name in (wanted or []) + skip:
        if name not in known:
            raise ValueError(f"unknown {kind} check {name!r}; {kind} checks are: "
                             f"{', '.join(known)}")
    if found and found[0]._spec is not None and wanted is not None:
        subject = found[0]._subject
        reasons = {spec.name: why for spec, why in _specs(subject)}
        for name in wanted:
            if reasons.get(name):
                raise ValueError(f"check {name!r} does not apply to {subject.label}: "
                                 f"{reasons[name]}")
    selected = [c for c in found
                if (wanted is None or c.name in wanted or c._spec is None) and c.name not in skip]
    failures, skipped = _run_checks(selected)
    if not failures and not quiet and selected:
        print(_passed_line(selected[0].plugin, len(selected) - skipped, skipped))
    if len(failures) == 1:
        raise failures[0]
    if failures:
        plugin_label = failures[0].plugin
        lines = "\n".join(f"  {exc}" for exc in failures)
        raise ConformanceError(
            plugin_label, None,
            f"broke {len(failures)} of {len(selected)} checks:\n{lines}", failures)


def _run_checks(selected: list[Check]) -> tuple[list[ConformanceError], int]:
    """Run ``selected``: the broken rules, and how many checks could not run (each a
    :class:`ConformanceWarning`)."""
    failures: list[ConformanceError] = []
    skipped = 0
    for check in selected:
        try:
            check()
        except ConformanceError as exc:
            failures.append(exc)
        except CheckSkipped as exc:
            skipped += 1
            warnings.warn(ConformanceWarning(f"{check.plugin}: {check.name}: skipped: {exc}"),
                          stacklevel=3)
    return failures, skipped


def _passed_line(plugin: str, passed: int, skipped: int) -> str:
    """``recalibrator 'shrink': 23 checks passed (1 skipped)``: check_plugin's success line."""
    line = f"{plugin}: {passed} check{'s' if passed != 1 else ''} passed"
    return line + (f" ({skipped} skipped)" if skipped else "")


ExpectedFailures = Mapping[str, str] | Callable[[str, Any, str], "str | None"]


def _expected_reason(expected: ExpectedFailures | None, kind: str, plugin: Any,
                     check: Check) -> str | None:
    if expected is None:
        return None
    if callable(expected) and not isinstance(expected, Mapping):
        return expected(kind, plugin, check.name)
    return expected.get(check.id) or expected.get(check.name)


def parametrize_with_checks(plugins: Iterable[Sequence[Any]], *,
                            expected_failures: ExpectedFailures | None = None,
                            xfail_strict: bool = False):
    """A ``pytest.mark.parametrize`` decorator over every check of every plugin.

    Imports pytest when called (an ``ImportError`` without it); nothing else in the kit
    needs pytest: :func:`check_plugin` runs the same checks in any Python process.

    Args:
        plugins: ``(kind, plugin)`` or ``(kind, plugin, params)`` entries, ``plugin`` as in
            :func:`plugin_checks`.
        expected_failures: checks known to fail, marked ``xfail`` (failing only with a
            :class:`ConformanceError`): a mapping from a check name (every plugin) or a test
            id ``kind-plugin-check`` to the reason, or a callable ``(kind, plugin, check
            name) -> reason or None``.
        xfail_strict: make an expected failure that passes fail the test.

    The test receives one argument, ``check``, to call; ids read
    ``recalibrator-temperature-check_pickle``::

        @parametrize_with_checks([("recalibrator", MyRecal), ("selector", MySel, {"k": 3})])
        def test_my_plugins(check):
            check()
    """
    import pytest

    params = []
    for entry in plugins:
        entry = tuple(entry)
        if len(entry) not in (2, 3):
            raise ValueError(f"plugins: expected (kind, plugin) or (kind, plugin, params), "
                             f"got {entry!r}")
        kind, plugin = entry[0], entry[1]
        options = entry[2] if len(entry) == 3 else None
        for check in _checks(kind, plugin, options, pytest_skip=True):
            reason = _expected_reason(expected_failures, kind, plugin, check)
            marks = ([pytest.mark.xfail(reason=reason, strict=xfail_strict,
                                        raises=ConformanceError)] if reason else [])
            params.append(pytest.param(check, id=check.id, marks=marks))
    return pytest.mark.parametrize("check", params)
