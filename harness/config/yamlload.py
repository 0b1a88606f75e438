"""YAML loading that remembers the line of every key and item, for file:line errors.

``load_yaml`` returns plain Python data plus a ``LineIndex`` mapping each path (tuple of keys and list
indexes) to the 1-based line where it is written. ``issues_from_validation`` turns a pydantic
``ValidationError`` into ``ConfigIssue`` records at those lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..errors import ConfigError, ConfigIssue

PathT = tuple[Any, ...]


class LineIndex:
    """Path -> line; a missing path resolves to its nearest written ancestor."""

    def __init__(self, file: str):
        self.file = file
        self.lines: dict[PathT, int] = {}

    def line(self, path: PathT) -> int | None:
        path = tuple(path)
        while True:
            if path in self.lines:
                return self.lines[path]
            if not path:
                return None
            path = path[:-1]

    def issue(self, path: PathT, message: str) -> ConfigIssue:
        return ConfigIssue(self.file, self.line(path), format_path(path), message)


def format_path(path: PathT) -> str:
    out = ""
    for p in path:
        if isinstance(p, int):
            out += f"[{p}]"
        else:
            out += ("." if out else "") + str(p)
    return out


def _construct(node: yaml.Node, path: PathT, index: LineIndex, issues: list[ConfigIssue]) -> Any:
    index.lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            key = _scalar(key_node)
            if key == "<<":
                issues.append(ConfigIssue(index.file, key_node.start_mark.line + 1, format_path(path),
                                          "YAML merge keys are not supported (write the keys out)"))
                continue
            if key in out:
                issues.append(ConfigIssue(index.file, key_node.start_mark.line + 1, format_path(path + (key,)),
                                          "duplicate key (each key may appear once)"))
            index.lines[path + (key,)] = key_node.start_mark.line + 1
            out[key] = _construct(value_node, path + (key,), index, issues)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(item, path + (i,), index, issues) for i, item in enumerate(node.value)]
    return _scalar(node)


def _scalar(node: yaml.Node) -> Any:
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_object(node, deep=True)
    finally:
        loader.dispose()


def load_yaml(path: str | Path, display_name: str | None = None) -> tuple[Any, LineIndex]:
    """Parse a YAML file; raise ConfigError (with line) on syntax errors or duplicate keys."""
    path = Path(path)
    name = display_name or str(path)
    index = LineIndex(name)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(ConfigIssue(name, None, "", f"cannot read file: {exc.strerror or exc}")) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(ConfigIssue(name, line, "", f"YAML syntax error: {problem}")) from None
    if node is None:
        raise ConfigError(ConfigIssue(name, 1, "", "file is empty (expected a mapping)"))
    issues: list[ConfigIssue] = []
    data = _construct(node, (), index, issues)
    if issues:
        raise ConfigError(issues)
    return data, index


def issues_from_validation(exc: ValidationError, index: LineIndex, prefix: PathT = ()) -> list[ConfigIssue]:
    """Map every pydantic error to file:line: path: message (expected ...)."""
    issues = []
    for err in exc.errors(include_url=False):
        loc = prefix + tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
        # pydantic adds the tag of a discriminated/literal union into loc; drop non-data parts
        loc = tuple(p for p in loc if not (isinstance(p, str) and "[" in p and "]" in p))
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key (not allowed here; check spelling)"
        elif err["type"] == "missing":
            msg = "required field is missing"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        elif msg.startswith("Assertion failed, "):
            msg = msg[len("Assertion failed, "):]
        issues.append(index.issue(loc, msg))
    return issues


def validate(model_cls: type, data: Any, index: LineIndex, prefix: PathT = (), context: dict | None = None):
    """Validate ``data`` with a pydantic model; raise ConfigError with every issue mapped to a line."""
    try:
        return model_cls.model_validate(data, context=context)
    except ValidationError as exc:
        raise ConfigError(issues_from_validation(exc, index, prefix)) from None
