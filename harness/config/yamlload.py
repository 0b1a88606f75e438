"""YAML loading that remembers the line of every key and item, for file:line errors.

``load_yaml`` returns plain Python data plus a ``LineIndex`` mapping each path (tuple of keys and list
indexes) to the 1-based line where it is written. It reads through :mod:`harness.safeio` and composes with
a nesting limit and an alias budget, so no input file can exhaust time, memory or the stack. ``issues_from_validation`` turns a pydantic
``ValidationError`` into ``ConfigIssue`` records at those lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from ..errors import ConfigError, ConfigIssue
from ..safeio import MAX_CONFIG_BYTES, MAX_DEPTH, InputFileError, read_text

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


MAX_ALIAS_VALUES = 100_000  # values YAML aliases may add on top of the ones written out


class _LimitError(yaml.MarkedYAMLError):
    """A document past one of kvgate's limits (nesting depth, alias expansion)."""

    def __init__(self, mark, problem: str):
        super().__init__(problem=problem, problem_mark=mark)


class _BoundedComposer(yaml.composer.Composer):
    """PyYAML's composer with a nesting limit and an alias budget, both checked while composing.

    Aliases compose to shared nodes, which cost nothing until the tree is walked; so every node records
    how many values and levels it stands for once aliases are expanded, and a document whose aliases add
    more than MAX_ALIAS_VALUES values (an alias bomb), nest past MAX_DEPTH, or refer to a node from inside
    it (a recursive structure) is refused before anything is expanded."""

    def __init__(self):
        yaml.composer.Composer.__init__(self)  # explicit: the concrete loaders' MROs differ past this class
        self._depth = 0
        self._written = 0
        self._expanded: dict[int, tuple[int, int]] = {}  # id(node) -> (values, levels) with aliases expanded

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            node = super().compose_node(parent, index)  # an undefined alias is a ComposerError here
            if id(node) not in self._expanded:
                raise _LimitError(event.start_mark, f"alias *{event.anchor} is used inside the node it names "
                                                    "(a recursive structure)")
            return node
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise _LimitError(self.peek_event().start_mark, f"nested deeper than {MAX_DEPTH} levels")
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        self._written += 1
        if isinstance(node, yaml.ScalarNode):
            size = (1, 1)
        else:
            children = ([n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode)
                        else node.value)
            sizes = [self._expanded[id(c)] for c in children]
            size = (1 + sum(v for v, _ in sizes), 1 + max((d for _, d in sizes), default=0))
        if size[0] > self._written + MAX_ALIAS_VALUES:
            raise _LimitError(node.start_mark, f"YAML aliases expand this to more than {MAX_ALIAS_VALUES} "
                                               "values (an alias bomb?); write the values out")
        if size[1] > MAX_DEPTH:
            raise _LimitError(node.start_mark, f"YAML aliases nest this deeper than {MAX_DEPTH} levels")
        self._expanded[id(node)] = size
        return node


class _PyLoader(_BoundedComposer, yaml.SafeLoader):
    """Events from PyYAML's pure-Python reader, scanner and parser."""

    def __init__(self, stream: str):
        yaml.SafeLoader.__init__(self, stream)
        _BoundedComposer.__init__(self)


try:
    from yaml._yaml import CParser as _CParser
except ImportError:  # PyYAML built without libyaml
    _CParser = None

if _CParser is not None:
    class _CLoader(_BoundedComposer, _CParser, yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
        """Events from libyaml (iterative, about 6x faster than pure Python), composed by _BoundedComposer:
        the same limits, and libyaml refuses nesting past 1000 levels itself without recursing."""

        def __init__(self, stream: str):
            _CParser.__init__(self, stream)
            _BoundedComposer.__init__(self)
            yaml.constructor.SafeConstructor.__init__(self)
            yaml.resolver.Resolver.__init__(self)

_LOADER: type = _CLoader if _CParser is not None else _PyLoader


_KIND = {yaml.MappingNode: "a mapping", yaml.SequenceNode: "a list", yaml.ScalarNode: "a single value"}


_PLAIN_TAGS = {yaml.MappingNode: "tag:yaml.org,2002:map", yaml.SequenceNode: "tag:yaml.org,2002:seq"}


def _construct(node: yaml.Node, path: PathT, index: LineIndex, issues: list[ConfigIssue],
               loader: yaml.SafeLoader) -> Any:
    index.lines.setdefault(path, node.start_mark.line + 1)
    if type(node) in _PLAIN_TAGS and node.tag != _PLAIN_TAGS[type(node)]:
        # !!set, !!omap, !!python/...: built as a plain mapping or list they would mean something else
        issues.append(ConfigIssue(index.file, node.start_mark.line + 1, format_path(path),
                                  f"YAML tag {node.tag!r} is not supported here (write a plain mapping or list)"))
        return None
    if isinstance(node, yaml.MappingNode):
        out: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if not isinstance(key_node, yaml.ScalarNode):
                issues.append(ConfigIssue(index.file, line, format_path(path),
                                          f"a key must be a plain value, not {_KIND[type(key_node)]}"))
                continue
            if key_node.tag == "tag:yaml.org,2002:merge" or key_node.value == "<<":
                issues.append(ConfigIssue(index.file, line, format_path(path),
                                          "YAML merge keys are not supported (write the keys out)"))
                continue
            key = _scalar(key_node, path, index, issues, loader)
            if key in out:
                issues.append(ConfigIssue(index.file, line, format_path(path + (key,)),
                                          "duplicate key (each key may appear once)"))
            index.lines[path + (key,)] = line
            out[key] = _construct(value_node, path + (key,), index, issues, loader)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(item, path + (i,), index, issues, loader) for i, item in enumerate(node.value)]
    return _scalar(node, path, index, issues, loader)


def _scalar(node: yaml.Node, path: PathT, index: LineIndex, issues: list[ConfigIssue],
            loader: yaml.SafeLoader) -> Any:
    try:
        return loader.construct_object(node, deep=True)
    except yaml.MarkedYAMLError as exc:  # e.g. a tag SafeLoader does not construct (!!python/object)
        problem = exc.problem or str(exc)
    except (yaml.YAMLError, ValueError, OverflowError, TypeError) as exc:  # e.g. !!int of 5000 digits
        problem = str(exc)
    issues.append(ConfigIssue(index.file, node.start_mark.line + 1, format_path(path),
                              f"bad value {node.value[:40]!r}: {' '.join(problem.split())}"))
    return None


def _syntax_issue(exc: yaml.YAMLError, text: str, name: str) -> ConfigIssue:
    """One line for any PyYAML or libyaml error, at the line it points to."""
    if isinstance(exc, yaml.reader.ReaderError):  # control characters are found before parsing; a fallback
        return ConfigIssue(name, None, "", f"not readable as YAML: {' '.join(str(exc.reason).split())}")
    mark = getattr(exc, "problem_mark", None)
    line = mark.line + 1 if mark is not None else None
    problem = " ".join((getattr(exc, "problem", None) or str(exc)).split())
    if isinstance(exc, _LimitError):
        return ConfigIssue(name, line, "", problem)
    context = getattr(exc, "context", None)
    lines = text.split("\n") if mark is not None else []
    at = lines[mark.line][mark.column:mark.column + 1] if mark is not None and mark.line < len(lines) else ""
    if at == "\t" or "'\\t'" in problem:  # libyaml does not name the character; PyYAML does
        problem = "a tab character where YAML does not allow one (indent with spaces)"
    elif "maximum nesting depth" in problem:  # libyaml's own limit (1000), reached before the composer's
        problem = f"nested deeper than {MAX_DEPTH} levels"
    elif context:
        problem += f" ({' '.join(context.split())})"
    return ConfigIssue(name, line, "", f"YAML syntax error: {problem}")


_NON_PRINTABLE = yaml.reader.Reader.NON_PRINTABLE  # what YAML 1.1 allows in a stream


def _parse(text: str, name: str, index: LineIndex, loader_cls: type) -> Any:
    bad = _NON_PRINTABLE.search(text)
    if bad:
        raise ConfigError(ConfigIssue(name, text.count("\n", 0, bad.start()) + 1, "",
                                      f"character #x{ord(bad.group()):04x} is not allowed in YAML "
                                      "(expected printable text)"))
    loader = None
    try:
        loader = loader_cls(text)
        node = loader.get_single_node()
        if node is None:
            raise ConfigError(ConfigIssue(name, 1, "", "file is empty (expected a mapping)"))
        if not isinstance(node, yaml.MappingNode):
            raise ConfigError(ConfigIssue(name, node.start_mark.line + 1, "",
                                          f"expected a mapping of keys at the top level, got {_KIND[type(node)]}"))
        issues: list[ConfigIssue] = []
        data = _construct(node, (), index, issues, loader)
    except yaml.YAMLError as exc:
        raise ConfigError(_syntax_issue(exc, text, name)) from None
    finally:
        if loader is not None:
            loader.dispose()
    if issues:
        raise ConfigError(issues)
    return data


def load_yaml(path: str | Path, display_name: str | None = None) -> tuple[Any, LineIndex]:
    """Parse a YAML configuration file into a mapping; raise ConfigError (with line) on anything else.

    The file is read with :func:`harness.safeio.read_text` (regular file, size cap, UTF-8); the document
    must be a mapping, nest at most ``MAX_DEPTH`` levels and expand aliases within ``MAX_ALIAS_VALUES``;
    duplicate keys, merge keys and values SafeLoader cannot construct are reported at their lines."""
    path = Path(path)
    name = display_name or str(path)
    index = LineIndex(name)
    try:
        text = read_text(path, max_bytes=MAX_CONFIG_BYTES, what="configuration file", display_name=name)
    except InputFileError as exc:
        raise ConfigError(ConfigIssue(name, exc.line, "", exc.message)) from None
    return _parse(text, name, index, _LOADER), index


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
