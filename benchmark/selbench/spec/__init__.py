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

The package: the schema and :class:`ResolvedSpec` (:mod:`selbench.spec.model`), YAML reading
(:mod:`selbench.spec.yamlio`), ``--set`` overrides (:mod:`selbench.spec.overrides`), the
capability checks (:mod:`selbench.spec.capabilities`), :func:`load_spec`
(:mod:`selbench.spec.load`) and the ``executor:`` options (:mod:`selbench.spec.executor`).
"""

from __future__ import annotations

from selbench.spec.capabilities import check_method as check_method
from selbench.spec.executor import ExecutorOptions as ExecutorOptions
from selbench.spec.load import load_spec
from selbench.spec.model import (
    MAX_DEPTH,
    NAME_MAX,
    SEED_MAX,
    SPEC_VERSION,
    BootstrapSpec,
    Component,
    ExperimentSpec,
    GuaranteeSpec,
    MethodSpec,
    ResolvedSpec,
    Spec,
    SpecError,
)
from selbench.spec.model import MAX_VALUES as MAX_VALUES
from selbench.spec.model import METHOD_FIELDS as METHOD_FIELDS
from selbench.spec.model import MetricNames as MetricNames
from selbench.spec.model import Name as Name
from selbench.spec.model import Seed as Seed
from selbench.spec.model import content_hash as content_hash
from selbench.spec.overrides import apply_overrides
from selbench.spec.yamlio import read_yaml as read_yaml

# The names imported ``as`` themselves stay importable from selbench.spec as before the
# split (the core imports some of them from here), though they are not in __all__.
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
