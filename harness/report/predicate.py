"""The shape of a signed predicate, checked once where a reader takes it from a bundle.

A signature says who wrote a predicate, not that it has the types this kvgate writes: a signer (or another
kvgate) can sign ``gate_id: ["G1"]``, ``suite.name: 5`` or ``actual: 1e999``. Every reader of a bundle's
predicate (``kvgate report``, ``compare``, the library, the re-evaluation) calls :func:`check_predicate` first,
so a misfit is one line naming the bundle and the field (``InputFileError``, exit 2) instead of a crash deep
in a renderer. Keys this kvgate does not read are allowed (a newer kvgate may add some); keys it reads must
have the type it writes.

Evidence (``verdicts[].evidence``) is workload-specific data: only its being an object is checked here; the
readers of its leaves take them through typed models or check each value they use.
"""

from __future__ import annotations

import math
import re
from datetime import datetime
from typing import Any

from ..config.models import GATE_ID_RE
from ..safeio import InputFileError, json_type

OUTCOMES = ("PASS", "FAIL", "STOP", "ERROR", "INVALID", "SKIPPED", "INFO")
COST_KIND = "kvgate-cost/v1"
UTC_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")

_STR = (str, type(None))
VERDICT_STR_FIELDS = ("title", "unit", "pass_threshold", "stop_loss_threshold", "reason")


def _number(v: Any) -> bool:
    """A JSON number a reader can use as a float (a bool is not one; an int past float's range is not)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        float(v)
    except OverflowError:
        return False
    return True


class _Check:
    def __init__(self, name: str):
        self.name = name

    def fail(self, where: str, msg: str) -> InputFileError:
        return InputFileError(self.name, None, f"predicate.{where}: {msg}")

    def kind(self, obj: dict, key: str, where: str, kinds: tuple, want: str, required: bool = False) -> Any:
        if key not in obj:
            if required:
                raise self.fail(where, f"required, missing (expected {want})")
            return None
        v = obj[key]
        if not isinstance(v, kinds) or (isinstance(v, bool) and bool not in kinds):
            raise self.fail(where, f"expected {want}, got {json_type(v)}")
        return v

    def strings(self, obj: dict, key: str, where: str) -> None:
        v = self.kind(obj, key, where, (list, type(None)), "an array of strings or null")
        for i, x in enumerate(v or []):
            if not isinstance(x, str):
                raise self.fail(f"{where}[{i}]", f"expected a string, got {json_type(x)}")

    def str_fields(self, obj: dict, keys: tuple[str, ...], where: str) -> None:
        for k in keys:
            self.kind(obj, k, f"{where}.{k}" if where else k, _STR, "a string or null")


def _check_verdict_fields(c: _Check, v: dict, where: str) -> None:
    """One verdict's fields after its gate ID (metric, outcome, texts, numbers, objects), checked in order."""
    c.kind(v, "metric", f"{where}.metric", (str,), "a metric name string", required=True)
    outcome = c.kind(v, "outcome", f"{where}.outcome", (str,), "an outcome string", required=True)
    if outcome not in OUTCOMES:
        raise c.fail(f"{where}.outcome", f"{outcome[:40]!r} is not an outcome ({', '.join(OUTCOMES)})")
    c.str_fields(v, VERDICT_STR_FIELDS, where)
    if v.get("actual") is not None and not _number(v["actual"]):
        raise c.fail(f"{where}.actual", f"expected a number or null, got {json_type(v['actual'])}"
                     + (" too large for a float" if isinstance(v["actual"], int) else ""))
    metrics = c.kind(v, "metrics", f"{where}.metrics", (dict, type(None)), "an object or null")
    for k, x in (metrics or {}).items():
        if not _number(x):
            raise c.fail(f"{where}.metrics.{k}", f"expected a number, got {json_type(x)}")
    units = c.kind(v, "metric_units", f"{where}.metric_units", (dict, type(None)), "an object or null")
    for k, x in (units or {}).items():
        if not isinstance(x, str):
            raise c.fail(f"{where}.metric_units.{k}", f"expected a unit string, got {json_type(x)}")
    c.kind(v, "evidence", f"{where}.evidence", (dict, type(None)), "an object or null")
    ref = c.kind(v, "reference", f"{where}.reference", (dict, type(None)), "an object or null")
    if ref is not None:
        c.str_fields(ref, ("value", "source", "note"), f"{where}.reference")


def check_predicate(pred: Any, name: str) -> None:
    """Check the fields of a signed predicate that kvgate's readers take (acceptance or cost predicate);
    ``InputFileError`` naming ``name`` and the first misfit otherwise. Fields a re-render drops
    (``report_id``, ``rendered_files``, ``created_utc``) are checked when present."""
    c = _Check(name)
    if not isinstance(pred, dict):
        raise InputFileError(name, None, f"predicate: expected an object, got {json_type(pred)}")
    created = c.kind(pred, "created_utc", "created_utc", _STR, "a string YYYY-MM-DDTHH:MM:SSZ")
    if created is not None:
        try:
            if not UTC_RE.match(created):
                raise ValueError
            datetime.strptime(created, "%Y-%m-%dT%H:%M:%SZ")
        except ValueError:
            raise c.fail("created_utc", f"{created[:40]!r} is not a time YYYY-MM-DDTHH:MM:SSZ") from None
    c.str_fields(pred, ("report_id", "kind", "model"), "")
    c.strings(pred, "rendered_files", "rendered_files")
    c.strings(pred, "input_report_ids", "input_report_ids")
    overall = c.kind(pred, "overall", "overall", _STR, "an outcome or null")
    if overall is not None and overall not in OUTCOMES:
        raise c.fail("overall", f"{overall[:40]!r} is not an outcome ({', '.join(OUTCOMES)})")
    for key, fields in (("suite", ("name", "description")), ("run", ("started_utc", "finished_utc")),
                        ("kvgate", ("version", "commit")), ("signing_key", ("kind", "fingerprint"))):
        obj = c.kind(pred, key, key, (dict, type(None)), "an object or null")
        if obj is not None:
            c.str_fields(obj, fields, key)
    suite = pred.get("suite")
    if isinstance(suite, dict):
        c.kind(suite, "version", "suite.version", (str, int, type(None)), "a string, an integer or null")
    run = pred.get("run")
    if isinstance(run, dict) and run.get("duration_s") is not None and not _number(run["duration_s"]):
        raise c.fail("run.duration_s", f"expected a number, got {json_type(run['duration_s'])}")
    verdicts = c.kind(pred, "verdicts", "verdicts", (list, type(None)), "an array of verdicts")
    seen: set[str] = set()
    for i, v in enumerate(verdicts or []):
        where = f"verdicts[{i}]"
        if not isinstance(v, dict):
            raise c.fail(where, f"expected a verdict object, got {json_type(v)}")
        gid = c.kind(v, "gate_id", f"{where}.gate_id", (str,), "a gate ID string", required=True)
        if not GATE_ID_RE.match(gid):
            raise c.fail(f"{where}.gate_id", f"{gid[:40]!r} is not a gate ID (a letter, then up to 31 letters, "
                                             "digits, '_' or '-')")
        if gid in seen:
            raise c.fail(f"{where}.gate_id", f"{gid} has two verdicts")
        seen.add(gid)
        _check_verdict_fields(c, v, where)


def finite(v: Any) -> bool:
    """A number that can be drawn (not NaN or infinite)."""
    return _number(v) and math.isfinite(float(v))
