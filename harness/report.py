"""Rendering of the reports that go inside a bundle (they print the report ID)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jinja2

from .paths import data_path


def fmt_value(v: float | None, unit: str) -> str:
    if v is None:
        return "—"
    return f"{v:.4g} {unit}".strip()


def _env() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(data_path("reports"))),
                             undefined=jinja2.ChainableUndefined, keep_trailing_newline=True,
                             autoescape=False)
    env.globals["fmt"] = fmt_value
    return env


def render_markdown(report_id: str, predicate: dict[str, Any]) -> str:
    return _env().get_template("report.md.j2").render(report_id=report_id, **predicate)


def render_bundle_reports(report_id: str, staging: Path, predicate: dict[str, Any]) -> list[str]:
    """Write report.md (and the report-ID-bearing verdict summary) into the staging bundle."""
    (staging / "report.md").write_text(render_markdown(report_id, predicate))
    (staging / "REPORT_ID").write_text(report_id + "\n")
    return ["report.md", "REPORT_ID"]
