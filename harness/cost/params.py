"""Parameters of ``kvgate cost``: a strict YAML model (units checked, file:line errors) and measured inputs.

A parameter is one of three kinds, and the report says which for every number:
* set in the params file (cited as ``FILE:LINE``),
* a documented default (cited by its source, see ``workloads/cost-params.example.yaml``),
* measured: taken from a verified report bundle (G1 ``per_gpu_read_gb_s``, G2 TTFTs), cited by report ID.
A params file that sets an input a bundle measures is an error, never a silent override.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from ..config.yamlload import LineIndex, load_yaml, validate
from ..engines.kv import ArchError, ModelArch, arch_from_config
from ..errors import BundleError, ConfigError, ConfigIssue
from ..gates.verdict import Verdict
from ..report.bundle import open_bundle, verify_bundle
from ..safeio import (MAX_CONFIG_BYTES, MAX_JSON_BYTES, InputFileError, check_keys, decode_utf8, json_type, key_line,
                      parse_json, read_bytes, read_text)
from ..units import UnitError, parse_quantity
from . import model as cost


# --------------------------------------------------------------------------- unit-checked fields


def _quantity(dimension: str, unit_scale: float, example: str):
    """A validator turning ``"5.23 GB/s"`` into a float in the field's unit (base value / ``unit_scale``)."""

    def check(value: Any) -> float:
        if isinstance(value, bool) or value is None:
            raise ValueError(f"expected a {dimension} like {example!r}, got {value!r}")
        if isinstance(value, (int, float)):
            if dimension == "ratio":
                return float(value)
            raise ValueError(f"expected a {dimension} with a unit, like {example!r}, got bare number {value!r}")
        try:
            q = parse_quantity(str(value), dimension)
        except UnitError as exc:
            raise ValueError(f"expected a {dimension} such as {example!r}: {exc}") from None
        return float(q.base) / unit_scale

    return BeforeValidator(check)


GbPerS = Annotated[float, _quantity("bandwidth", 1e9, "5.23 GB/s"), Field(gt=0)]
Seconds = Annotated[float, _quantity("time", 1.0, "11.85 s"), Field(ge=0)]
PositiveSeconds = Annotated[float, _quantity("time", 1.0, "11.85 s"), Field(gt=0)]
Ratio01 = Annotated[float, _quantity("ratio", 1.0, "0.6 or 60 %"), Field(ge=0, le=1)]
RatioNonNeg = Annotated[float, _quantity("ratio", 1.0, "0.2 or 20 %"), Field(ge=0)]
PosNumber = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegNumber = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=False)


class ModelSpec(_Strict):
    """Which model: a config.json (path relative to the params file) and optionally the KV cache dtype."""

    config: str
    kv_dtype: str | None = None


class Workload(_Strict):
    context_tokens: PosNumber
    gpus_per_instance: Annotated[int, Field(gt=0)] = 8
    prefill_tokens_per_s_per_gpu: PosNumber = 2500.0
    decode_tokens_per_session: NonNegNumber = 1000.0
    decode_tokens_per_s_per_gpu: PosNumber = 400.0


class Tier(_Strict):
    per_gpu_read: GbPerS = 5.23
    readback_fixed: Seconds = 0.0
    capacity_overhead: RatioNonNeg = 0.0
    write_amplification: PosNumber = 1.0  # device bytes written per stored KV byte (a serving gate measures it)


class Measured(_Strict):
    readback_ttft: PositiveSeconds | None = None
    recompute_ttft: PositiveSeconds | None = None


class Fleet(_Strict):
    sessions_per_day: PosNumber
    revisit_rate: Ratio01
    hit_rate: Ratio01 | None = None  # required unless a bundle measures it (g2-gain's tier_hit_rate)
    retention_days: PosNumber


class Prices(_Strict):
    gpu_usd_per_hour: NonNegNumber = 2.0
    storage_usd_per_tb_month: NonNegNumber
    drive_usd_per_tb_written: NonNegNumber = 0.0  # a drive's price / its rated writes (capacity x DWPD x 365 x years)


InputName = Literal[cost.INPUTS]  # type: ignore[valid-type]
OutputName = Literal[cost.OUTPUTS]  # type: ignore[valid-type]


def _low_le_high(pair: tuple[float, float]) -> tuple[float, float]:
    if not pair[0] <= pair[1]:
        raise ValueError(f"low {pair[0]:g} is above high {pair[1]:g}; write [low, high]")
    return pair


Range = Annotated[tuple[float, float], AfterValidator(_low_le_high)]


class Sensitivity(_Strict):
    spread: Annotated[float, Field(gt=0, lt=1)] = 0.5
    metric: OutputName = "net_usd_per_month"  # type: ignore[valid-type]
    inputs: list[InputName] | None = None  # type: ignore[valid-type]
    ranges: dict[InputName, Range] = Field(default_factory=dict)  # type: ignore[valid-type]


class CostParams(_Strict):
    """The whole params file."""

    model: ModelSpec
    timing: Literal["model", "measured"] = "model"
    workload: Workload
    tier: Tier = Field(default_factory=Tier)
    measured: Measured = Field(default_factory=Measured)
    fleet: Fleet
    prices: Prices
    sensitivity: Sensitivity = Field(default_factory=Sensitivity)

    @field_validator("tier", "measured", "sensitivity", mode="before")
    @classmethod
    def _empty_section(cls, value: Any) -> Any:
        # a section whose keys are all commented out reads as null; it means "all defaults"
        return {} if value is None else value

    @model_validator(mode="after")
    def _ratio_ranges(self) -> CostParams:
        for name in cost.RATIO_INPUTS:
            if name in self.sensitivity.ranges:
                lo, hi = self.sensitivity.ranges[name]
                if lo < 0 or hi > 1:
                    raise ValueError(f"sensitivity.ranges.{name}: a rate range must lie within [0, 1]")
        return self


# canonical input name -> (YAML path, default source). Every numeric input of harness.cost appears here
# except kv_bytes_per_token, which comes from the model config.
PARAM_PATHS: dict[str, tuple[tuple[str, ...], str]] = {
    "context_tokens": (("workload", "context_tokens"), ""),
    "gpus_per_instance": (("workload", "gpus_per_instance"), "default: one 8-GPU node per instance"),
    "prefill_tokens_per_s_per_gpu": (
        ("workload", "prefill_tokens_per_s_per_gpu"),
        "default: ~2.5k tokens/s per GPU for 70B+ models (30k for 8-30B): public vLLM prefill benchmarks, estimate",
    ),
    "decode_tokens_per_session": (("workload", "decode_tokens_per_session"), "default: estimate"),
    "decode_tokens_per_s_per_gpu": (
        ("workload", "decode_tokens_per_s_per_gpu"),
        "default: batched decode throughput per GPU, estimate",
    ),
    "per_gpu_read_gb_s": (
        ("tier", "per_gpu_read"),
        "default: 5.23 GB/s per-GPU cold read, vendor reference R1 (not measured in this run)",
    ),
    "readback_fixed_s": (("tier", "readback_fixed"), "default: 0 s (no fixed read-back overhead)"),
    "capacity_overhead_ratio": (("tier", "capacity_overhead"), "default: 0 (no metadata/replica overhead)"),
    "device_write_amplification": (("tier", "write_amplification"),
                                   "default: 1 (the device writes only the KV; a serving gate measures it)"),
    "drive_usd_per_tb_written": (("prices", "drive_usd_per_tb_written"),
                                 "default: 0 (drive wear not priced)"),
    "readback_ttft_s": (
        ("measured", "readback_ttft"),
        "reference: 11.85 s read-back TTFT p50, vendor reference R2 (not measured in this run)",
    ),
    "recompute_ttft_s": (
        ("measured", "recompute_ttft"),
        "reference: 12.6x the read-back TTFT p50, vendor reference R2 (not measured in this run)",
    ),
    "sessions_per_day": (("fleet", "sessions_per_day"), ""),
    "revisit_rate": (("fleet", "revisit_rate"), ""),
    "hit_rate": (("fleet", "hit_rate"), ""),
    "retention_days": (("fleet", "retention_days"), ""),
    "gpu_usd_per_hour": (("prices", "gpu_usd_per_hour"), "default: $2 per GPU-hour, cloud list-price estimate"),
    "storage_usd_per_tb_month": (("prices", "storage_usd_per_tb_month"), ""),
}

_FIELD_OF = {  # YAML leaf name -> attribute name on the section model
    "per_gpu_read": "per_gpu_read",
    "readback_fixed": "readback_fixed",
    "capacity_overhead": "capacity_overhead",
    "write_amplification": "write_amplification",
    "readback_ttft": "readback_ttft",
    "recompute_ttft": "recompute_ttft",
}

# which measured metric feeds which input: verdict metric names (or evidence keys) accepted for each input
MEASURED_METRICS: dict[str, tuple[str, ...]] = {
    "per_gpu_read_gb_s": ("per_gpu_read_gb_s",),
    "readback_ttft_s": ("readback_ttft_p50_s", "ttft_readback_p50_s", "readback_ttft_s"),
    "recompute_ttft_s": ("recompute_ttft_p50_s", "ttft_recompute_p50_s", "recompute_ttft_s"),
    # g2-gain: of the context its load could reuse, the share the tier served (docs/g2.md, "The tier's worth")
    "hit_rate": ("tier_hit_rate",),
    # g2-gain: the measured throughput gain of the same load with the tier over without it; not a model input,
    # set beside the model's own throughput_gain in the report (a cross-check, as the measured TTFTs are)
    "measured_throughput_gain": ("throughput_gain",),
    # a serving gate's device bytes written per stored KV byte (its evidence's endurance, docs/endurance.md)
    "device_write_amplification": ("write_amplification",),
}
SIGNED_MEASUREMENTS = frozenset({"measured_throughput_gain"})
"""Measured figures that may be zero or negative (a gain): any finite number is a measurement."""
USABLE_OUTCOMES = ("PASS", "FAIL", "STOP", "INFO")
"""Verdict outcomes whose ``actual`` is a measurement. ERROR/INVALID/SKIPPED runs measured nothing usable."""


# --------------------------------------------------------------------------- measured inputs


@dataclass(frozen=True)
class MeasuredInput:
    """One number taken from a verified bundle."""

    name: str  # canonical input name, e.g. per_gpu_read_gb_s
    value: float
    report_id: str
    gate_id: str
    metric: str  # the verdict metric or evidence key it came from
    outcome: str


def _finite(val: Any) -> float | None:
    """A measured figure as a float, when it is a finite number (zero and below included)."""
    if isinstance(val, bool) or not isinstance(val, (int, float)):
        return None
    try:
        x = float(val)
    except OverflowError:
        return None
    return x if math.isfinite(x) else None


def _finite_positive(val: Any) -> float | None:
    """A measured figure as a float, when it is a finite number above zero (a signed 10**400, NaN or inf is
    not a measurement, whatever signed it)."""
    x = _finite(val)
    return x if x is not None and x > 0 else None


def extract_measured(verdicts: Mapping[str, Any], report_id: str) -> list[MeasuredInput]:
    """Measured cost inputs in a bundle's verdicts.json (pure).

    A verdict contributes its ``actual`` when its ``metric`` is a known name, and any known key of its
    ``metrics`` (all metrics its workload reported), ``evidence`` or ``evidence["metrics"]`` when numeric. Verdicts whose outcome is not a measurement
    (ERROR, INVALID, SKIPPED) contribute nothing.
    """
    found: list[MeasuredInput] = []
    for v in verdicts.get("verdicts", []) or []:
        if not isinstance(v, Mapping) or str(v.get("outcome", "")).upper() not in USABLE_OUTCOMES:
            continue
        gate_id, outcome = str(v.get("gate_id", "?")), str(v.get("outcome")).upper()
        seen: set[str] = set()
        candidates: list[tuple[str, Any]] = [(str(v.get("metric")), v.get("actual"))]
        evidence = v.get("evidence") if isinstance(v.get("evidence"), Mapping) else {}
        for scope in (v.get("metrics"), evidence, evidence.get("metrics"), evidence.get("endurance")):
            if isinstance(scope, Mapping):
                candidates.extend((str(k), val) for k, val in scope.items())
        for key, val in candidates:
            for name, keys in MEASURED_METRICS.items():
                x = _finite(val) if name in SIGNED_MEASUREMENTS else _finite_positive(val)
                if x is not None and key in keys and name not in seen:
                    seen.add(name)
                    found.append(MeasuredInput(name, x, report_id, gate_id, key, outcome))
    return found


# --------------------------------------------------------------------------- resolved parameters


@dataclass(frozen=True)
class InputValue:
    name: str
    value: float
    source: str  # "FILE:LINE", "default: ...", "measured: KVG-... G1 per_gpu_read_gb_s (PASS)", "config.json"
    kind: str  # "param" | "default" | "measured" | "model"
    line: int | None = None  # line in the params file, for kind "param"


@dataclass(frozen=True)
class Resolved:
    """Parameters ready for :func:`harness.cost.model.evaluate`: one value and one source per input."""

    params: CostParams
    params_path: Path
    arch: ModelArch
    model_config_path: Path
    inputs: dict[str, InputValue]
    measured: tuple[MeasuredInput, ...]
    timing: str
    sensitivity_ranges: dict[str, tuple[float, float]]

    @property
    def base(self) -> dict[str, float]:
        return {k: v.value for k, v in self.inputs.items()}

    @property
    def input_report_ids(self) -> list[str]:
        return sorted({m.report_id for m in self.measured})

    @property
    def measured_gain(self) -> MeasuredInput | None:
        """The throughput gain a g2-gain bundle measured (set beside the model's in the report), if one did."""
        return next((m for m in self.measured if m.name == "measured_throughput_gain"), None)


def _section_value(params: CostParams, path: tuple[str, ...]) -> tuple[Any, bool]:
    section = getattr(params, path[0])
    attr = _FIELD_OF.get(path[1], path[1])
    return getattr(section, attr), attr in section.model_fields_set


def _line(lines: LineIndex, path: Sequence[Any]) -> int | None:
    return lines.line(tuple(path))


def _json_key_line(text: str, key: str) -> int:
    needle = f'"{key}"'
    for number, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return number
    return 1


def load_model_arch(config_path: Path, kv_dtype: str | None) -> ModelArch:
    """Read a config.json into a :class:`harness.engines.kv.ModelArch`; errors name the file and line of the key."""
    try:
        text = read_text(config_path, max_bytes=MAX_CONFIG_BYTES, what="model config")
        data = parse_json(text, str(config_path))
    except InputFileError as exc:
        raise ConfigError([ConfigIssue(str(config_path), exc.line, "", f"model config: {exc.message}")]) from None
    if not isinstance(data, dict):
        raise ConfigError([ConfigIssue(str(config_path), 1, "", "expected a JSON object")])
    try:
        return arch_from_config(data, name=config_path.stem, kv_dtype=kv_dtype)
    except ArchError as exc:
        raise ConfigError(
            [ConfigIssue(str(config_path), _json_key_line(text, exc.field), exc.field, exc.message)]
        ) from None


def _inputs(params: CostParams, lines: Any, fname: str, by_name: dict[str, MeasuredInput],
            issues: list[ConfigIssue]) -> dict[str, InputValue]:
    """Every model input with its source: measured by a bundle (a parameter set for it too is an issue), set in
    the file (file:line), or the default; an input with neither is left out."""
    inputs: dict[str, InputValue] = {}
    for name, (path, default_source) in PARAM_PATHS.items():
        value, was_set = _section_value(params, path)
        line = _line(lines, path)
        if name in by_name:
            m = by_name[name]
            if was_set:
                issues.append(ConfigIssue(fname, line, ".".join(path), (
                    f"set here but measured in bundle {m.report_id} ({m.gate_id} {m.metric} = {m.value:g}); "
                    "a parameter may not override a measured input: remove it or drop the bundle")))
            inputs[name] = InputValue(
                name, m.value, f"measured: {m.report_id} {m.gate_id} {m.metric} ({m.outcome})", "measured"
            )
        elif value is None:
            continue
        elif was_set:
            inputs[name] = InputValue(name, float(value), f"{fname}:{line}", "param", line)
        else:
            inputs[name] = InputValue(name, float(value), default_source, "default")
    return inputs


def _sensitivity_ranges(sens: Any, used: list[str], base: dict[str, float]) -> dict[str, tuple[float, float]]:
    """The sensitivity sweep's range per input: the ones the file gives, the default spread around the base value
    for the rest of the swept inputs (those named, or every used non-zero input that moves a figure)."""
    sweep_names = list(sens.inputs) if sens.inputs is not None else [
        n for n in used if n not in ("gpus_per_instance",) and base.get(n, 0.0) != 0.0
        # the write amplification moves nothing while drive wear is not priced
        and not (n == "device_write_amplification" and not base.get("drive_usd_per_tb_written"))
    ]
    sweep_names = sorted(set(sweep_names) | set(sens.ranges))
    ranges = cost.default_ranges(base, [n for n in sweep_names if n not in sens.ranges], sens.spread)
    ranges.update({k: (float(lo), float(hi)) for k, (lo, hi) in sens.ranges.items()})
    return ranges


def _measured_by_name(measured: Sequence[MeasuredInput], fname: str
                      ) -> tuple[dict[str, MeasuredInput], list[ConfigIssue]]:
    """(each measured input by name, the first bundle's; an issue for each input that two bundles measure)."""
    by_name: dict[str, MeasuredInput] = {}
    issues: list[ConfigIssue] = []
    for m in measured:
        if m.name in by_name and by_name[m.name].report_id != m.report_id:
            other = by_name[m.name]
            issues.append(ConfigIssue(fname, 1, m.name, (
                f"measured by two bundles ({other.report_id} {other.gate_id}, {m.report_id} {m.gate_id}); "
                "pass only one")))
        by_name.setdefault(m.name, m)
    return by_name, issues


def _missing_input_issues(params: CostParams, inputs: dict[str, InputValue], lines: Any,
                          fname: str) -> list[ConfigIssue]:
    """The issues of inputs that neither the file nor a bundle gives: the hit rate, and the TTFTs that
    ``timing: measured`` needs."""
    issues: list[ConfigIssue] = []
    if "hit_rate" not in inputs:
        issues.append(ConfigIssue(fname, _line(lines, ("fleet",)), "fleet.hit_rate", (
            "required field is missing (or pass a g2-gain bundle, whose tier_hit_rate is measured)")))
    if params.timing == "measured":
        missing = [n for n in cost.MEASURED_ONLY if n not in inputs]
        if missing:
            issues.append(ConfigIssue(fname, _line(lines, ("timing",)), "timing", (
                f"'measured' needs {' and '.join(missing)}: give a G2 bundle or set measured.* in the file")))
    return issues


def resolve(
    params_path: str | Path, measured: Sequence[MeasuredInput] = ()
) -> Resolved:
    """Load and validate a params file, merge measured inputs, and return every input with its source.

    Raises ``ConfigError`` with all issues (file:line:path: message): schema and unit errors, a parameter set
    in the file that a bundle measures, two bundles measuring the same input, ``timing: measured`` without
    both TTFTs, sensitivity ranges for inputs the model does not use, a bad model config.
    """
    params_path = Path(params_path)
    data, lines = load_yaml(params_path)
    params: CostParams = validate(CostParams, data, lines)
    fname = str(params_path)

    by_name, issues = _measured_by_name(measured, fname)
    inputs = _inputs(params, lines, fname, by_name, issues)
    issues.extend(_missing_input_issues(params, inputs, lines, fname))

    config_path = (params_path.parent / params.model.config)
    arch: ModelArch | None = None
    try:
        arch = load_model_arch(config_path, params.model.kv_dtype)
    except ConfigError as exc:
        issues.extend(exc.issues)

    used = [n for n in cost.INPUTS if n not in cost.MEASURED_ONLY or params.timing == "measured"]
    sens = params.sensitivity
    for name in list(sens.ranges) + list(sens.inputs or []):
        if name not in used:
            issues.append(ConfigIssue(fname, _line(lines, ("sensitivity",)), f"sensitivity.{name}",
                                      f"input {name!r} is not used with timing: {params.timing}"))
    if issues:
        raise ConfigError(issues)
    assert arch is not None

    inputs["kv_bytes_per_token"] = InputValue(
        "kv_bytes_per_token", float(arch.kv_bytes_per_token), f"{config_path.name}: {arch.formula()}", "model"
    )
    ordered = {n: inputs[n] for n in cost.INPUTS if n in inputs}
    ranges = _sensitivity_ranges(sens, used, {n: v.value for n, v in ordered.items()})
    return Resolved(
        params=params,
        params_path=params_path,
        arch=arch,
        model_config_path=config_path,
        inputs=ordered,
        measured=tuple(sorted(by_name.values(), key=lambda m: m.name)),
        timing=params.timing,
        sensitivity_ranges=dict(sorted(ranges.items())),
    )


# --------------------------------------------------------------------------- bundles


# What the runner writes into verdicts.json, and into each of its verdicts (harness.gates.verdict.Verdict); a
# key outside these is refused rather than ignored, so a misspelt measurement is never silently dropped.
SUMMARY_KEYS = frozenset({"suite", "overall", "verdicts", "run"})
VERDICT_KEYS = frozenset(f.name for f in dataclasses.fields(Verdict))


def read_verdicts(raw: bytes, name: str) -> dict[str, Any]:
    """A bundle's verdicts.json (bytes already digest-checked): UTF-8, strict JSON, the shape the runner
    writes. InputFileError naming ``name`` and the line where there is one."""
    text = decode_utf8(raw, name)
    data = parse_json(text, name)
    check_keys(data, SUMMARY_KEYS, name, "verdicts.json", text, root=True)
    verdicts = data.get("verdicts")
    if not isinstance(verdicts, list):
        raise InputFileError(name, key_line(text, "verdicts"), f"verdicts: expected an array, got {json_type(verdicts)}")
    for i, v in enumerate(verdicts):
        check_keys(v, VERDICT_KEYS, name, f"verdicts[{i}]", text)
        for key, kinds in (("gate_id", (str,)), ("metric", (str,)), ("outcome", (str,)), ("metrics", (dict, type(None))),
                           ("evidence", (dict, type(None))), ("actual", (int, float, type(None)))):
            if key in v and (not isinstance(v[key], kinds) or isinstance(v[key], bool)):
                raise InputFileError(name, key_line(text, key), f"verdicts[{i}].{key}: unexpected {json_type(v[key])}")
    return data


def measured_from_bundle(bundle_path: str | Path, pubkey_path: str | Path) -> list[MeasuredInput]:
    """Verify a report bundle (directory or .tar.gz) and return the cost inputs its verdicts.json measured.

    Nothing is read from a bundle before :func:`harness.report.bundle.verify_bundle` says OK, and the verdicts.json
    bytes used are checked against the digest in the signed statement (so a file swapped after verification
    is refused too). Raises ``BundleError`` (one line, naming the bundle) when the bundle does not verify,
    holds no verdicts.json, or measured nothing the cost model uses.
    """
    bundle_path = Path(bundle_path)
    if not bundle_path.exists():
        raise BundleError(f"{bundle_path}: no such bundle")
    try:
        with open_bundle(bundle_path) as root:
            result = verify_bundle(root, pubkey_path)
            if not result.ok or result.statement is None or result.report_id is None:
                raise BundleError(f"{bundle_path}: refused: does not verify: {result.error}")
            digests = {s["name"]: s["digest"]["sha256"] for s in result.statement.get("subject", [])}
            if "verdicts.json" not in digests:
                raise BundleError(f"{bundle_path}: refused: {result.report_id} holds no verdicts.json")
            try:
                raw = read_bytes(root / "verdicts.json", max_bytes=MAX_JSON_BYTES, what="verdicts file",
                                 follow_symlinks=False, display_name="verdicts.json")
            except InputFileError as exc:
                raise BundleError(f"{bundle_path}: refused: {exc}") from None
            if hashlib.sha256(raw).hexdigest() != digests["verdicts.json"]:
                raise BundleError(f"{bundle_path}: refused: verdicts.json changed after verification")
    except BundleError as exc:  # an unreadable archive is refused like a bundle that does not verify
        msg = str(exc)
        if ": refused: " in msg:
            raise
        raise BundleError(f"{bundle_path}: refused: {msg.removeprefix(f'{bundle_path}: ')}") from None
    try:
        verdicts = read_verdicts(raw, "verdicts.json")
    except InputFileError as exc:
        raise BundleError(f"{bundle_path}: refused: {result.report_id} {exc}") from None
    found = extract_measured(verdicts, result.report_id)
    if not found:
        gates = ", ".join(f"{v.get('gate_id')} {v.get('metric')} {v.get('outcome')}"
                          for v in verdicts.get("verdicts", []) if isinstance(v, Mapping)) or "no verdicts"
        raise BundleError(f"{bundle_path}: {result.report_id} measured no cost input "
                          f"(needs {', '.join(k for keys in MEASURED_METRICS.values() for k in keys)}; has {gates})")
    return found
