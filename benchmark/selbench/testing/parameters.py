"""The first check of every plugin: ``__init__`` stores its parameters as scikit-learn's
estimator contract asks (issue 36). selbench's ``get_params`` / ``set_params`` (and so
``sklearn.base.clone``, the tuning's rebuilt trials and the kit's other checks) read each
``__init__`` argument back from the attribute of the same name; a parameter stored under
another name breaks all of them at once, far from the cause. This check names the rule and
the parameter, and while it fails the kit's other checks of that plugin are not run
(:func:`params_problem`), so the one cause is not reported as a dozen downstream errors.
The ideas are those of scikit-learn's estimator checks (parameters default-constructible,
``get_params`` invariant, nothing but the parameters set in ``__init__``), written for
selbench's plugins.
"""

from __future__ import annotations

import inspect
from typing import Any

from selbench.contract.api import KINDS

from .errors import Broken
from .support import Subject, fmt_exc, register_check, same

#: the check's name, which :class:`selbench.testing.Check` and ``check_plugin`` look for
PARAMS_CHECK = "check_init_stores_params"


def _init_names(cls: type) -> list[str]:
    """The keyword parameters of ``cls.__init__`` (no ``self``, ``*args``, ``**kwargs``)."""
    if cls.__init__ is object.__init__:
        return []
    return [p.name for p in inspect.signature(cls.__init__).parameters.values()
            if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _passed(s: Subject, obj: Any) -> dict[str, Any] | None:
    """The values the subject's factory passed to ``obj.__init__`` (None: unknown, e.g. an
    instance, or a factory function)."""
    if s.init_class is None or type(obj) is not s.init_class:
        return None
    return s.passed


def _stored_as(obj: Any, value: Any, names: list[str]) -> list[str]:
    """The attributes other than the parameters that hold ``value`` (where a renamed
    parameter went)."""
    try:
        attrs = vars(obj)
    except TypeError:
        return []
    return sorted(k for k, v in attrs.items() if k not in names and not k.startswith("__")
                  and (v is value or same(v, value)))


def _problem(s: Subject, obj: Any) -> tuple[str, bool] | None:
    """What is wrong with how ``obj`` (built by the subject's factory) stores its
    parameters, and whether it breaks ``get_params`` itself (what the other checks stand
    on: a parameter not stored at all), or None."""
    cls = type(obj)
    if not callable(getattr(obj, "get_params", None)):
        return None  # not the kind's base class: check_base_class says so
    names = _init_names(cls)
    renamed = dict(getattr(cls, "param_attributes", {}) or {})
    passed = _passed(s, obj)
    for name in names:
        attr = renamed.get(name, name)
        if not hasattr(obj, attr):
            hint = ""
            if passed is not None and name in passed:
                found = _stored_as(obj, passed[name], names)
                if found:
                    hint = f" (its value is stored as self.{found[0]})"
            return (f"__init__ argument {name!r} is not stored as self.{attr}{hint}; store "
                    f"each argument unchanged under its own name (self.{name} = {name}), or "
                    f"declare param_attributes = {{{name!r}: '<attribute>'}}, so that "
                    "get_params(), set_params() and sklearn.base.clone can read it back",
                    True)
    try:
        got = obj.get_params(deep=False)
    except Exception as exc:
        return f"get_params(deep=False) raised {fmt_exc(exc)}", True
    if sorted(got) != sorted(names):
        return (f"get_params(deep=False) returned the parameters {sorted(got)}, but __init__ "
                f"takes {sorted(names)}", True)
    for name in names:
        if passed is not None and name in passed and not same(got[name], passed[name]):
            return (f"__init__ stored {name}={got[name]!r}, but {passed[name]!r} was passed; "
                    "store each argument unchanged (validate or convert it in fit, not in "
                    "__init__), so that sklearn.base.clone rebuilds the same plugin", False)
    return None


def params_problem(s: Subject) -> str | None:
    """How the subject breaks the parameter rule so that ``get_params`` itself fails (a
    parameter not stored under its name): what the kit's other checks stand on, so they wait
    for it. None when ``get_params`` works (a value stored changed is check_clone's and
    this check's failure, not a cascade), or the plugin cannot be built (other checks say
    so). Worked out once per subject."""
    if "params_problem" not in s.notes:
        try:
            obj = s.factory()
        except BaseException:
            s.notes["params_problem"] = None
        else:
            s.notes["params_problem"] = _problem(s, obj)
    found = s.notes["params_problem"]
    return found[0] if found is not None and found[1] else None


@register_check(*KINDS)
def check_init_stores_params(s: Subject) -> None:
    """``__init__`` stores every argument unchanged under its own name (``self.n_bins =
    n_bins``, or the attribute ``param_attributes`` names), so that ``get_params()`` returns
    exactly the parameters it was built with: scikit-learn's estimator rule, which
    ``set_params``, ``sklearn.base.clone``, tuning and the kit's other checks rely on (they
    are not run while this one fails)."""
    obj = s.make()
    problem = _problem(s, obj)
    s.notes["params_problem"] = problem
    if problem is not None:
        raise Broken(problem[0])
