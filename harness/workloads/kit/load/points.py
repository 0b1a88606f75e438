"""The load-point runner g2-load, both arms of g2-gain and the capacity sweep call (:class:`LoadPoints`), and the G2
view of a load gate's engine."""

from __future__ import annotations

import asyncio
import json
import time

from ....engines import EngineProfile
from ....engines.client import STOP_POLL_S, CompletionRequest
from ....engines.load import LoadRecord, arrival_offsets, client_priority, closed_loop, load_point, open_loop
from ....errors import ConfigError
from ....load.traces import Trace
from ....parsers.pooldev import PoolDeviceStat, read_bytes_between
from ....parsers.prometheus import Sample, counter_delta, metric_total
from ..base import ControlFile, GateContext, write_gate_file
from ..phases import PhaseRunner
from ..g2 import G2EngineParams, G2Evidence, G2Params, G2Procedure, model_config_files
from .evaluate import Counters, point_invalid, spoiled_attempt, token_accounting
from .evidence import G2LoadEvidence, PointTrial
from .requests import (LoadPrompts, load_trace, multi_turn_text, point_seed, synthetic_requests, trace_requests,
                       trace_source_text)
from .spec import G2LoadParams


# ------------------------------------------------------------------------------------------------ the workload


def g2_view(p: G2LoadParams, longest_prompt: int) -> G2Params:
    """The G2 parameters g2-ttft's engine set-up reads, for this run: the engine as given (only the fields the
    gate set, so validation says what it says for g2-ttft) and one prompt as long as the longest of the run."""
    given = {name: getattr(p, name) for name in p.model_fields_set if name in G2EngineParams.model_fields}
    if p.attach is not None:
        given["attach"] = p.attach.as_g2()
    if "model_config_path" in given:
        given["model_config"] = given.pop("model_config_path")
    return G2Params.model_validate({**given, "prompt_tokens": [longest_prompt], "prompts_per_length": 1,
                                    "max_tokens": p.max_tokens})


async def _until_stopped(coro, stop) -> list[LoadRecord]:
    """Run a load point's requests; once the gate's cancellation is set, drop them (Cancelled raised by the
    caller's check)."""
    task = asyncio.ensure_future(coro)
    while not task.done():
        if stop.is_set():
            task.cancel()
            break
        await asyncio.wait({task}, timeout=STOP_POLL_S)
    try:
        return await task
    except asyncio.CancelledError:
        return []


def load_control_files(params: G2LoadParams) -> list[ControlFile]:
    """The control-host files a load gate reads: its trace (checked by `kvgate validate` and `run`
    (Workload.file_issues), not when a suite is loaded, so a bundle re-evaluated on a machine without the trace still
    loads its suite: the run recorded its sha256) and the model's config."""
    trace = ([ControlFile(("load", "path"), "trace", params.load.path, lambda _: load_trace(params.load))]
             if params.load is not None and params.load.path is not None else [])   # g2-gain's capacity: has none
    return trace + model_config_files(params)


def load_issues(params: G2LoadParams, nodes) -> list[tuple[tuple, str]]:
    """A load gate's engine and pool checked as G2's are, for the longest prompt it sends, named as g2-load's."""
    g2 = G2Procedure().validate_against(g2_view(params, params.prompt_tokens), nodes)
    return [(path, msg.replace("g2-ttft", "g2-load")) for path, msg in g2]


class LoadPoints:
    """The load-point runner g2-load, both arms of g2-gain and its capacity sweep call: the schedule of
    points x trials, the requests of a point, its attempts (a spoiled one repeated), the sends, the
    counters settled around it and the pool device read over it."""

    def schedule(self, p: G2LoadParams) -> list[tuple[int, str, float]]:
        """Every point × trial in the order the run sends them: trial by trial, each the whole ladder."""
        return [(t, label, load) for t in range(1, p.trials + 1) for label, load in p.load.points()]

    def point_text(self, p: G2LoadParams, label: str, load: float, trial: int) -> str:
        k = p.load.kind
        if k == "closed":
            what = f"closed loop: {int(load)} user{'s' if load != 1 else ''}, {p.requests_per_point} requests"
        elif k == "open":
            what = (f"open loop: {p.requests_per_point} requests at {load:g} requests/s, gamma arrivals (burstiness "
                    f"{p.load.burstiness or 1.0:g}), sent on schedule")
        elif p.load.multi_turn is not None and not p.load.users and not p.load.time_scale:
            what = multi_turn_text(p.load.multi_turn)
        else:
            how = (f"in its order by {p.load.users} user{'s' if p.load.users != 1 else ''}, each sending its next "
                   "request when its previous one finished (its timestamps not used)" if p.load.users
                   else f"timestamps x {p.load.time_scale or 1.0:g}")
            what = f"trace replay of {trace_source_text(p.load)}, {how}"
        shape = ("" if k == "trace" else f", prompts of {p.prompt_tokens} tokens sharing {p.shared_prefix_tokens} "
                 f"per {p.prefix_groups} prefix group(s)")
        again = (f"; an attempt its own client spoils (client lag p99 over {p.max_client_lag_p99_s * 1e3:g} ms), or "
                 "one with a read before the cold regime dropped its store, is set "
                 f"aside and repeated with new prompts ({p.repeat_spoiled} repeat{'s' if p.repeat_spoiled != 1 else ''} "
                 "at most per engine)" if p.repeat_spoiled else "")
        return (f"{what}{shape}, {p.max_tokens} output tokens at most; the engine's counters before and after; "
                f"every request to requests-{label}-t{trial}.jsonl{again}")

    @staticmethod
    def longest_prompt(p: G2LoadParams) -> int:
        if p.load.kind != "trace":
            return p.prompt_tokens
        try:
            trace = load_trace(p.load)
        except (ConfigError, ValueError):
            return p.prompt_tokens
        per = p.load.tokens_per_block or trace.block_tokens
        return max(-(-r.input_tokens * per // trace.block_tokens) for r in trace.requests)

    @staticmethod
    def engine_evidence(ev: G2LoadEvidence, g: G2Evidence | None) -> None:
        if g is None:
            return
        for name in ("engine_profile", "engine", "engine_version", "versions", "base_url", "client_path", "attached",
                     "pool_dir", "kv_bytes_per_token", "random_model", "pool"):
            setattr(ev, name, getattr(g, name))

    def _requests(self, p: G2LoadParams, label: str, load: float, t: int, seed: int, prompts: LoadPrompts,
                  trace: Trace | None) -> tuple[list[CompletionRequest], list[float] | None]:
        if trace is not None:
            per = p.load.tokens_per_block or trace.block_tokens
            reqs, offsets = trace_requests(p, trace, per, label, t, seed, prompts.vocab_size)
            return prompts.finish(reqs), (None if p.load.users else offsets)  # by users: in order, one by one
        reqs = prompts.finish(synthetic_requests(p, label, t, seed, prompts.vocab_size))
        if p.load.kind == "open":
            return reqs, arrival_offsets(len(reqs), load, p.load.burstiness or 1.0, seed)
        return reqs, None

    def _point(self, ctx: GateContext, p: G2LoadParams, prof: EngineProfile, runner: PhaseRunner, setup,
               counters: Counters, t: int, label: str, load: float, trace: Trace | None, seed: int,
               prompts: LoadPrompts, ev: G2LoadEvidence, attempt: int = 0) -> PointTrial:
        """One point × trial, a phase of the runner: counters, pool device and log before, the requests (and the
        engine's counting of them), the same after. ``attempt`` k > 0 (a repeat of a spoiled attempt): new prompts
        (no KV of the attempt before can be reused) and files of its own (``requests-LABEL-tT-aK.jsonl``)."""
        pseed = point_seed(seed, label if not attempt else f"{label}+{attempt}", t)
        reqs, offsets = self._requests(p, label, load, t, pseed, prompts, trace)
        kind = {"closed": "concurrency", "open": "rate_rps", "trace": "trace"}[p.load.kind]
        if trace is not None:
            load = len(reqs) / trace.duration_s if trace.duration_s > 0 else 0.0
        tag = f"{label}-t{t}" + (f"-a{attempt}" if attempt else "")
        name = f"requests-{tag}.jsonl"
        pt = PointTrial(label=label, load=load, load_kind=kind, trial=t, attempt=attempt, seed=pseed,
                        requests=len(reqs), requests_file=name)
        eng = setup.engine

        def send() -> list[LoadRecord]:
            base = eng.metrics() if counters.any else None
            pt.started_unix_s = time.time()
            out = self._send(ctx, p, prof, eng.base_url, reqs, offsets, load, ev)
            # the runner reads the counters after this returns: once the engine has counted these requests
            self.settled_metrics(ctx, eng, counters, base, sum(r.record.prompt_tokens or 0 for r in out
                                                                 if r.record.ok))
            return out

        rec = runner.phase(tag, send, device=lambda: self._pool_stat(ctx, setup, ev))
        records, reading = rec.output, rec.engines["engine"]
        pool = getattr(eng, "pool", None)
        if pool is not None:  # an evicting cold regime: did it drop every store before it was read back?
            pt.cold = pool.mark(tag)
        m0, m1, s0, s1 = reading.metrics_before, reading.metrics_after, rec.device_before, rec.device_after
        write_gate_file(ctx.gate_dir / name, "".join(json.dumps(r.to_dict()) + "\n" for r in records))
        if m0 is not None and m1 is not None:
            names = (counters.prompt_tokens + counters.memory_hit_tokens + counters.tier_hit_tokens
                     + list(counters.ram_hit_tokens) + list(counters.extra))
            pt.counters_file = f"counters-{tag}.json"
            write_gate_file(ctx.gate_dir / pt.counters_file, json.dumps(
                {when: {n: metric_total(m, [n]) for n in names} for when, m in (("before", m0), ("after", m1))},
                indent=1))
        if not records:
            pt.error = "no request was sent"
            return pt
        fig = load_point(records, p.ttft_slo_s, p.tpot_slo_s)
        pt.figures = fig

        delta = reading.delta
        if counters.extra:
            pt.extra_counters = {n: delta([n]) for n in counters.extra}
        sent = sum(r.record.prompt_tokens or 0 for r in records if r.record.ok)
        writes = None if s0 is None or s1 is None or s0.maj_min != s1.maj_min \
            else s1.stat.write_bytes - s0.stat.write_bytes
        pt.accounting = token_accounting(sent, delta(counters.prompt_tokens), delta(counters.memory_hit_tokens),
                                         delta(counters.tier_hit_tokens), setup.ev.kv_bytes_per_token,
                                         read_bytes_between(s0, s1), writes, fig.duration_s,
                                         delta(list(counters.ram_hit_tokens)) if counters.ram_hit_tokens else None)
        pt.invalid_reason = point_invalid(fig, pt.accounting, p.max_client_lag_p99_s, p.min_read_fraction,
                                          prof.device_reads, ev.pool_device_error, p.max_failed_share, pt.cold)
        if not fig.ok:
            first = next(r.record.error for r in records if not r.record.ok)
            pt.error = f"every request failed; first: {first}"
        return pt

    def attempts(self, ctx: GateContext, p: G2LoadParams, prof: EngineProfile, runner: PhaseRunner, setup,
                  counters: Counters, t: int, label: str, load: float, trace: Trace | None, seed: int,
                  prompts: LoadPrompts, ev: G2LoadEvidence) -> PointTrial:
        """One point × trial as :meth:`_point`, repeated with new prompts while its attempt was spoiled (its client
        missed the schedule, or the cold regime fell behind its reads: :func:`spoiled_attempt`) and
        ``repeat_spoiled`` allows one more (counted over ``ev``: the run, or one arm); every attempt set aside goes
        to ``ev.spoiled`` with its files, and the last attempt counts."""
        attempt = 0
        while True:
            pt = self._point(ctx, p, prof, runner, setup, counters, t, label, load, trace, seed, prompts, ev,
                             attempt)
            if not spoiled_attempt(pt, p.max_client_lag_p99_s) or len(ev.spoiled) >= p.repeat_spoiled:
                return pt
            ev.spoiled.append(pt)
            ctx.progress(f"{ctx.gate.id}: trial {t}, load point {label}: attempt {attempt} set aside, spoiled "
                         f"({pt.invalid_reason}); repeating with new prompts "
                         f"({len(ev.spoiled)} of {p.repeat_spoiled} repeats used)")
            attempt += 1

    def _send(self, ctx: GateContext, p: G2LoadParams, prof: EngineProfile, base_url: str,
              reqs: list[CompletionRequest], offsets: list[float] | None, load: float,
              ev: G2LoadEvidence | None = None) -> list[LoadRecord]:
        """A point's requests, open loop on their schedule or closed loop by users, from a thread of raised priority
        (harness.engines.load.client_priority, what it did in ``ev.client_priority``); the gate's cancellation
        drops them and raises Cancelled."""
        ctx.cancel.check()
        kw = dict(transport=ctx.http, timeout_s=ctx.cancel.bound_timeout_s(p.request_timeout_s),
                  path=prof.api.request_path, api=prof.api.shape())
        if offsets is not None:
            coro = open_loop(base_url, reqs, offsets, p.served_model_name, **kw)
        else:  # a ladder's users, or a trace replayed in order by its users
            users = p.load.users if p.load.kind == "trace" and p.load.users else int(load)
            coro = closed_loop(base_url, reqs, users, p.served_model_name, **kw)
        with client_priority() as how:
            if ev is not None:
                ev.client_priority = how
            records = asyncio.run(_until_stopped(coro, ctx.cancel))
        ctx.cancel.check()
        return records

    @staticmethod
    def settled_metrics(ctx: GateContext, eng, counters: Counters, m0: list[Sample] | None, sent: int,
                         tries: int = 10) -> list[Sample] | None:
        """The engine's counters after requests of ``sent`` prompt tokens (those that succeeded). An engine may
        answer the last token before it counts the request (vLLM records its statistics after the output is
        sent): read again, 0.2 s apart on the gate's clock and ``tries`` times at most, until its prompt-token
        counter grew by what was sent since ``m0``."""
        if m0 is None:
            return None
        m1 = eng.metrics()
        for _ in range(tries):
            got = counter_delta(m0, m1, counters.prompt_tokens)
            if got is None or got >= sent:
                break
            ctx.cancel.sleep(0.2)
            m1 = eng.metrics()
        return m1

    @staticmethod
    def _pool_stat(ctx: GateContext, setup, ev: G2LoadEvidence) -> PoolDeviceStat | None:
        if not setup.pool_dir:
            return None
        dev = G2Procedure().pool_stat(ctx, setup.pool_transport, setup.pool_dir, setup.ev)
        ev.pool_device, ev.pool_device_maj_min = setup.ev.pool_device, setup.ev.pool_device_maj_min
        ev.pool_device_error = setup.ev.pool_device_error
        return dev
