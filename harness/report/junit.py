"""The verdicts of a run as JUnit XML, so CI systems show each gate as a test case.

Mapping: PASS and INFO pass; FAIL and STOP are ``<failure>``; ERROR and INVALID are ``<error>``;
SKIPPED is ``<skipped>``. The report ID and the overall verdict are ``<properties>`` of the suite.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any, Mapping

FAILURE = {"FAIL", "STOP"}
ERROR = {"ERROR", "INVALID"}
SKIPPED = {"SKIPPED"}


def _value(v: Mapping[str, Any]) -> str:
    a = v.get("actual")
    return "none" if a is None else f"{a:.6g} {v.get('unit') or ''}".strip()


def verdicts_to_junit(report_id: str, suite: Mapping[str, Any], verdicts: list[Mapping[str, Any]],
                      overall: str | None = None, durations_s: Mapping[str, float | None] | None = None) -> str:
    """Render the verdicts (dicts as in verdicts.json) as a JUnit XML document (deterministic)."""
    durations_s = durations_s or {}
    name = f"kvgate {suite.get('name', '?')} v{suite.get('version', '?')}"
    counts = {"tests": len(verdicts),
              "failures": sum(v["outcome"] in FAILURE for v in verdicts),
              "errors": sum(v["outcome"] in ERROR for v in verdicts),
              "skipped": sum(v["outcome"] in SKIPPED for v in verdicts)}
    total = sum(float(d) for d in durations_s.values() if d is not None)
    root = ET.Element("testsuites", {"name": name, **{k: str(c) for k, c in counts.items()}, "time": f"{total:.3f}"})
    ts = ET.SubElement(root, "testsuite", {"name": name, "id": report_id, **{k: str(c) for k, c in counts.items()},
                                           "time": f"{total:.3f}"})
    props = ET.SubElement(ts, "properties")
    for k, val in (("report_id", report_id), ("overall", overall or ""), ("suite", str(suite.get("name", ""))),
                   ("suite_version", str(suite.get("version", "")))):
        ET.SubElement(props, "property", {"name": k, "value": val})
    for v in verdicts:
        d = durations_s.get(v["gate_id"])
        tc = ET.SubElement(ts, "testcase", {
            "classname": f"kvgate.{suite.get('name', 'suite')}", "name": f"{v['gate_id']} {v['title']}",
            "time": f"{float(d):.3f}" if d is not None else "0.000"})
        detail = (f"{v['metric']} = {_value(v)}; pass {v['pass_threshold']}"
                  + (f"; stop-loss {v['stop_loss_threshold']}" if v.get("stop_loss_threshold") else "")
                  + f"; outcome {v['outcome']}: {v.get('reason', '')}")
        outcome = v["outcome"]
        if outcome in FAILURE:
            el = ET.SubElement(tc, "failure", {"type": outcome, "message": v.get("reason", "")})
            el.text = detail
        elif outcome in ERROR:
            el = ET.SubElement(tc, "error", {"type": outcome, "message": v.get("reason", "")})
            el.text = detail
        elif outcome in SKIPPED:
            ET.SubElement(tc, "skipped", {"message": v.get("reason", "")})
        out = ET.SubElement(tc, "system-out")
        out.text = f"report {report_id}: {detail}"
    ET.indent(root, space=" ")
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
