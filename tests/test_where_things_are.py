"""Where a new user looks for things (issue 36, item 5): every public name in ``dir(selbench)``,
the README's Python section naming what the package offers, and a description in every
command's ``--help``. (``reliability_diagram`` returning its Axes: tests/test_reliability_ci.py;
``check_plugin``'s success line: tests/test_testing_kit.py.)"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import selbench
from selbench.cli import build_parser, main

README = Path(__file__).resolve().parents[1] / "README.md"


def test_every_public_name_is_in_dir_and_resolves():
    names = dir(selbench)
    lazy = {"SelectiveRecalibrator", "ModuleRecalibrator", "run_module", "NotFittedError",
            "check_confidence", "check_features", "check_outputs", "tune"}
    assert lazy <= set(selbench.__all__)
    assert set(selbench.__all__) <= set(names)  # lazily loaded ones included
    assert names == sorted(names)
    for name in selbench.__all__:
        assert getattr(selbench, name) is not None, name
    from selbench.library.estimator import SelectiveRecalibrator

    assert selbench.SelectiveRecalibrator is SelectiveRecalibrator


def _python_section() -> str:
    text = README.read_text(encoding="utf-8")
    return text.split("## From Python", 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize("name", ["SelectiveRecalibrator", "risk_coverage_curve",
                                  "reliability_diagram", "selbench.tune", "selbench.run"])
def test_the_readme_python_section_names_what_the_package_offers(name):
    assert name in _python_section()


def test_risk_coverage_curve_is_where_the_readme_says():
    m = re.search(r"`(selbench\.[\w.]+)\.risk_coverage_curve", _python_section())
    assert m, "the README names risk_coverage_curve with its module"
    import importlib

    assert callable(importlib.import_module(m.group(1)).risk_coverage_curve)


def _subcommands() -> dict:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices


def test_the_listing_commands_have_a_description():
    for name in ("plugins", "metrics"):
        assert _subcommands()[name].description, name


@pytest.mark.parametrize(("command", "needles"), [
    ("plugins", ["entry point", "tuning space", "list only this kind"]),
    ("metrics", ["metrics: [...]", "lower or higher is better"]),
])
def test_listing_commands_say_what_they_list(capsys, command, needles):
    assert main([command, "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    for needle in needles:
        assert needle in out, (command, needle)
