"""``--set key.path=value`` overrides of a raw spec: parsing the key path (dots, ``[i]``
indices, list elements named by ``name`` or ``label``) and :func:`apply_overrides`.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from selbench.spec.model import SpecError
from selbench.spec.yamlio import YamlProblem, parse_yaml

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
            parsed = parse_yaml(value) if value.strip() else ""
        except YamlProblem as exc:
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
