"""harness.safeio.dumps_indented writes the same text as json.dumps with indent: report IDs hash these files."""

from __future__ import annotations

import enum
import json
import random

import pytest

from harness.safeio import dumps_indented


class _Level(enum.IntEnum):
    HIGH = 3


class _NotJson:
    def __str__(self) -> str:
        return "not-json"


def _value(rng: random.Random, depth: int):
    roll = rng.random()
    if depth > 4 or roll < 0.4:
        return rng.choice([None, True, False, 0, -7, 2**70, 1.5, -0.0, 1e300, float("nan"), float("inf"), "",
                           "é\n\"\\x", "plain", _Level.HIGH, _NotJson()])
    if roll < 0.7:
        items = [_value(rng, depth + 1) for _ in range(rng.randint(0, 4))]
        return items if rng.random() < 0.7 else tuple(items)
    return {rng.choice(["a", "b", "é", "z"]) + str(rng.randint(0, 9)): _value(rng, depth + 1)
            for _ in range(rng.randint(0, 4))}


CASES = [
    {}, [], {"a": []}, {"a": {}}, [[]], [{}],
    {"status": "ok", "rc": 0, "timed_out": False, "error": None, "duration_s": 0.001234},
    {"node": "n1", "argv": ["sh", "-c", "x"], "env": {"K": "v"}, "timeout_s": None},
    {"series": [{"t0_s": 1.0, "t1_s": 1.1, "bytes": 4096}, {"t0_s": 1.1, "t1_s": 1.2, "bytes": 0}], "n": [1, 2.5]},
    {1: "int key", 2.5: "float key", True: "bool key", None: "none key"},
    {"z": {"b": [1, {"y": 2, "x": [3, [4, {}]]}], "a": ()}},
]


@pytest.mark.parametrize("indent", [1, 2])
@pytest.mark.parametrize("sort_keys", [False, True])
def test_same_text_as_json_dumps(indent: int, sort_keys: bool) -> None:
    rng = random.Random(27)
    for obj in CASES + [_value(rng, 0) for _ in range(3000)]:
        try:
            want = json.dumps(obj, indent=indent, sort_keys=sort_keys, default=str)
        except TypeError:  # mixed key types under sort_keys: both refuse
            with pytest.raises(TypeError):
                dumps_indented(obj, indent=indent, sort_keys=sort_keys, default=str)
            continue
        assert dumps_indented(obj, indent=indent, sort_keys=sort_keys, default=str) == want, obj


def test_without_default_an_unknown_object_is_the_same_type_error() -> None:
    with pytest.raises(TypeError, match="Object of type _NotJson is not JSON serializable"):
        dumps_indented({"a": [1, {"b": _NotJson()}]})
    with pytest.raises(TypeError, match="keys must be str, int, float, bool or None"):
        dumps_indented({(1, 2): [1]})
