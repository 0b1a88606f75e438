"""The load kit, one module per idea, what every load gate (g2-load, both arms of g2-gain, its capacity sweep)
shares: ``spec`` (the params and the ``load:`` spec), ``evidence`` (what a load gate records; metric names and
units), ``requests`` (the requests of a point: prompts, synthetic points, a trace's requests), ``evaluate`` (token
accounting, a point's validity, the figures over trials with their intervals, the knee, the gate's validity, the
same again from raw files) and ``points`` (:class:`LoadPoints`, the load-point runner). What a load gate measures
and how it is judged: harness/workloads/g2_load.py. Its names are imported from here."""

from __future__ import annotations

from .spec import G2LoadParams, LoadAttachParams, LoadSpec, MULTI_TURN_PATH, MultiTurnLoad, SHAPE_KEYS
from .evidence import (FIGURES, G2LoadEvidence, LABEL_RE, LoadModel, MetricInterval, PointSummary, PointTrial,
                       SUMMARY_METRICS, TokenAccounting, TraceInfo, point_metric_unit)
from .evaluate import (BOUND_FIELDS, Counters, accounting_counters, emit, evaluate_load, failed_issue, figure_values,
                       hit_efficiency_per_trial, hits_by_level, interval, load_validity, point_invalid,
                       points_endurance, raw_records, read_check, read_issue, records_from_jsonl, reevaluate_load,
                       spoiled_attempt, spoiled_by_client, spoiled_by_cold_regime, spoiled_issue, token_accounting)
from .requests import (LoadPrompts, load_fields, load_prompts, load_trace, multi_turn_text, point_seed,
                       read_load_trace, synthetic_requests, trace_error, trace_requests, trace_source_text)
from .points import LoadPoints, g2_view, load_control_files, load_issues

__all__ = ["G2LoadParams", "LoadAttachParams", "LoadSpec", "MULTI_TURN_PATH", "MultiTurnLoad", "SHAPE_KEYS",
           "FIGURES", "G2LoadEvidence", "LABEL_RE", "LoadModel", "MetricInterval", "PointSummary", "PointTrial",
           "SUMMARY_METRICS", "TokenAccounting", "TraceInfo", "point_metric_unit", "BOUND_FIELDS", "Counters",
           "accounting_counters", "emit", "evaluate_load", "failed_issue", "figure_values",
           "hit_efficiency_per_trial", "hits_by_level", "interval", "load_validity", "point_invalid",
           "points_endurance", "raw_records", "read_check", "read_issue", "records_from_jsonl", "reevaluate_load",
           "spoiled_attempt", "spoiled_by_client", "spoiled_by_cold_regime", "spoiled_issue", "token_accounting",
           "LoadPrompts", "load_fields", "load_prompts",
           "load_trace", "multi_turn_text", "point_seed", "read_load_trace", "synthetic_requests", "trace_error",
           "trace_requests", "trace_source_text", "LoadPoints", "g2_view", "load_control_files", "load_issues"]
