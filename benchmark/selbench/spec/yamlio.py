"""Reading a spec's YAML: the loader that bounds nesting (:data:`~selbench.spec.model.MAX_DEPTH`),
duplicated keys reported with their lines, :func:`read_yaml` (UTF-8, one mapping) and the
shape check of a raw spec (:func:`shape_problem`: depth, reference cycles, aliases that
expand to too much).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from selbench.spec.model import MAX_DEPTH, MAX_VALUES, SpecError


class YamlProblem(Exception):
    """A YAML document that cannot become a spec; ``line`` is 1-based."""

    def __init__(self, message: str, line: int | None = None, column: int | None = None):
        super().__init__(message)
        self.message, self.line, self.column = message, line, column

    def format(self, source: str | None = None) -> str:
        """``source, line L, column C: message`` (the parts known)."""
        where = [source] if source else []
        if self.line is not None:
            where += [f"line {self.line}", f"column {self.column}"]
        return f"{', '.join(where) or 'YAML'}: {self.message}"


#: PyYAML's problems (a fragment of its text) in our words; the first match is used
_OUR_WORDS = (
    ("mapping values are not allowed", "a ':' where a plain value was expected; put a nested "
     "mapping on its own, indented lines, or quote a value that contains ': '"),
    ("could not find expected ':'", "a key without its ':', or a line that continues a value "
     "at the wrong indentation"),
    ("found character '\\t'", "a tab character; indent YAML with spaces"),
    ("cannot start any token", "a character that cannot start a plain value (such as '@', "
     "'`' or '%'); quote the value"),
    ("expected <block end>", "the indentation does not match the lines above (a line indented "
     "more or less than the others at its level)"),
    ("did not find expected key", "the indentation does not match the lines above (a line "
     "indented more or less than the others at its level)"),
    ("did not find expected '-'", "a list item ('- ...') at the wrong indentation"),
    ("expected ',' or ']'", "a '[' list is not closed by ']', or two of its items lack a ',' "
     "between them"),
    ("expected ',' or '}'", "a '{' mapping is not closed by '}', or two of its entries lack a "
     "',' between them"),
    ("found unexpected end of stream", "the file ends inside a quoted string or a bracket: a "
     "closing quote, ']' or '}' is missing"),
    ("found undefined alias", "an alias '*name' refers to no anchor '&name' defined before it"),
    ("found duplicate anchor", "the same anchor '&name' is defined twice"),
    ("unknown escape character", "an unknown backslash escape in a double-quoted string; use "
     "single quotes, or write the backslash twice"),
    ("found unhashable key", "a key that is a list or a mapping; keys are plain names"),
    ("expected a comment or a line break", "something follows a value on the same line (a "
     "missing line break, or text after a closing quote)"),
    ("expected the node content", "a value is missing (an empty item, or a stray ',')"),
    ("expected alphabetic or numeric character", "an anchor or alias name ('&name', '*name') "
     "is empty or not alphanumeric"),
)


def in_our_words(problem: str) -> str:
    """A PyYAML problem as selbench says it (unknown ones as 'not valid YAML (...)')."""
    for fragment, words in _OUR_WORDS:
        if fragment in problem:
            return f"not valid YAML: {words}"
    return f"not valid YAML ({problem})"


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader that refuses nesting deeper than :data:`MAX_DEPTH` while composing (so a
    pathological file cannot exhaust Python's recursion limit)."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent, index):
        if not self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent):
            return super().compose_node(parent, index)
        self._depth += 1  # lists and mappings only, as in shape_problem
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise YamlProblem(f"nested more than {MAX_DEPTH} levels deep",
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


def parse_yaml(text: str) -> Any:
    """Parse one YAML document with :class:`_SpecLoader`; raises :class:`YamlProblem` or
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
        problem = in_our_words(exc.problem or exc.context or str(exc).splitlines()[0])
        raise YamlProblem(problem, *((mark.line + 1, mark.column + 1) if mark else ())) from None
    except yaml.reader.ReaderError as exc:  # a non-printable character
        before = text[: exc.position]
        char = exc.character if isinstance(exc.character, int) else ord(exc.character[:1] or "?")
        raise YamlProblem(
            f"unacceptable character U+{char:04X} ({exc.reason})",
            before.count("\n") + 1, exc.position - (before.rfind("\n") + 1) + 1,
        ) from None
    except yaml.YAMLError as exc:
        raise YamlProblem(in_our_words(str(exc).splitlines()[0] if str(exc)
                                       else type(exc).__name__)) from None
    except RecursionError:  # not expected with the depth limit above; never a traceback
        raise YamlProblem(f"nested too deeply to read (at most {MAX_DEPTH} levels)") from None


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
        data = parse_yaml(text)
    except YamlProblem as exc:
        raise SpecError([exc.format(src)], src) from None
    except SpecError as exc:
        raise SpecError(exc.errors, src) from None
    if data is None:
        raise SpecError([f"{path}: the file is empty; a spec is a YAML mapping with "
                         "spec_version, name, ..."], src)
    if not isinstance(data, dict):
        raise SpecError(["<root>: a spec is a YAML mapping with spec_version, name, ..."], src)
    return data


def shape_problem(data: Any) -> str | None:
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
