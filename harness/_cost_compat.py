"""TEMPORARY stand-ins for foundation APIs (harness.errors / config / units) not yet on main.

Written against the interfaces in the helper brief; deleted once `git merge main` brings the real modules.
Only harness.cost_params imports this, and only when the real module is missing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pydantic
import yaml


class HarnessError(Exception):
    pass


@dataclass(frozen=True)
class ConfigIssue:
    file: str
    line: int
    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.path}: {self.message}"


class ConfigError(HarnessError):
    def __init__(self, issues: list[ConfigIssue]) -> None:
        self.issues = list(issues)
        super().__init__("\n".join(str(i) for i in self.issues))


class LineIndex(dict):
    """path tuple -> 1-based line."""

    def line_of(self, path: tuple) -> int:
        path = tuple(path)
        while path and path not in self:
            path = path[:-1]
        return self.get(path, 1)


def _walk(node: yaml.Node, path: tuple, index: LineIndex) -> None:
    index[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = k.value
            index[path + (key,)] = k.start_mark.line + 1
            _walk(v, path + (key,), index)
            index[path + (key,)] = k.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            _walk(v, path + (i,), index)


def load_yaml(path: str | Path) -> tuple[Any, LineIndex]:
    text = Path(path).read_text(encoding="utf-8")
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        line = getattr(getattr(exc, "problem_mark", None), "line", 0) + 1
        raise ConfigError([ConfigIssue(str(path), line, "", f"YAML: {exc}")]) from None
    index = LineIndex()
    if node is not None:
        _walk(node, (), index)
    return data, index


def validate(model_cls, data, path, lines):
    try:
        return model_cls.model_validate(data)
    except pydantic.ValidationError as exc:
        issues = []
        for err in exc.errors():
            loc = tuple(err["loc"])
            dotted = "".join(f"[{p}]" if isinstance(p, int) else (f".{p}" if i else str(p)) for i, p in enumerate(loc))
            issues.append(ConfigIssue(str(path), lines.line_of(loc), dotted, err["msg"]))
        raise ConfigError(issues) from None


_UNITS = {
    "bandwidth": {"B/s": 1, "kB/s": 1e3, "KB/s": 1e3, "MB/s": 1e6, "GB/s": 1e9, "TB/s": 1e12,
                  "KiB/s": 1024, "MiB/s": 1024**2, "GiB/s": 1024**3,
                  "Mb/s": 1e6 / 8, "Gb/s": 1e9 / 8, "Gbit/s": 1e9 / 8},
    "time": {"s": 1, "ms": 1e-3, "us": 1e-6, "min": 60, "h": 3600},
    "size": {"B": 1, "kB": 1e3, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KiB": 1024, "MiB": 1024**2,
             "GiB": 1024**3, "TiB": 1024**4},
    "ratio": {"": 1, "%": 0.01, "x": 1},
}


@dataclass(frozen=True)
class Quantity:
    value: float
    dimension: str
    unit: str

    @property
    def base(self) -> float:
        return self.value * _UNITS[self.dimension][self.unit]


def parse_quantity(text: str) -> Quantity:
    m = re.fullmatch(r"\s*([-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)\s*([A-Za-z%/]*)\s*", str(text))
    if not m:
        raise ValueError(f"not a quantity: {text!r}")
    value, unit = float(m.group(1)), m.group(2)
    for dim, table in _UNITS.items():
        if unit in table:
            return Quantity(value, dim, unit)
    raise ValueError(f"unknown unit {unit!r} in {text!r}")
