"""The two arms' engines: the arm without the tier, the engine memory both get, what differs between them, the prompts
both send."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from ...engines import EngineProfile, check_lmcache_config, load_profile
from ...errors import ConfigError
from ..kit.load import G2LoadEvidence, LoadPrompts, load_prompts
from .spec import ARMS, GainParams


def no_tier_profile(p: GainParams, prof: EngineProfile) -> EngineProfile:
    """The arm without the tier: ``no_tier_engine``'s profile, or ``engine``'s with its ``no_tier_flag``; both arms
    get ``engine_cache_flag engine_cache_tokens`` where the gate bounds the engine's memory."""
    base = load_profile(p.no_tier_engine) if p.no_tier_engine else prof
    flag = [] if p.no_tier_engine else [prof.capabilities.no_tier_flag]
    return with_cache(p, base, flag)


def engine_cache_value(prof: EngineProfile, tokens: int) -> int:
    """Pure: what the profile's ``engine_cache_flag`` takes for an engine memory of ``tokens`` tokens: the tokens,
    or the KV blocks that hold them (``engine_cache_block_tokens``; the gate gives whole blocks)."""
    per = prof.capabilities.engine_cache_block_tokens
    return tokens if per is None else -(-tokens // per)


def engine_cache_issues(p: GainParams, prof: EngineProfile) -> list[tuple[tuple, str]]:
    """Pure: an engine memory the profile's flag cannot give exactly (not whole KV blocks)."""
    per = prof.capabilities.engine_cache_block_tokens
    if p.engine_cache_tokens is None or per is None or p.engine_cache_tokens % per == 0:
        return []
    return [(("engine_cache_tokens",), f"{p.engine_cache_tokens} tokens is not a whole number of {per}-token KV "
             f"blocks (profile {prof.name!r} sets its engine memory in blocks): give a multiple of {per}")]


def no_tier_engine_issues(p: GainParams, prof: EngineProfile, attached: bool) -> list[tuple[tuple, str]]:
    """The arm without the tier's profile (``no_tier_engine``), when the gate names one: it loads, runs the same
    engine as ``prof`` with the same argv and environment less the tier switch (:func:`unequal_arms`), and is
    launched by kvgate or attached to as the tier arm is."""
    if p.no_tier_engine is None:
        return []
    try:
        other = load_profile(p.no_tier_engine)
    except ConfigError as exc:
        return [(("no_tier_engine",), str(exc.issues[0]))]
    issues = []
    if other.engine != prof.engine:
        issues.append((("no_tier_engine",), f"profile {other.name!r} runs {other.engine}, not {prof.engine}: both "
                       "arms must be the same engine"))
    extra = unequal_arms(prof, other)
    if extra:
        issues.append((("no_tier_engine",), f"profile {other.name!r} is not {prof.name!r} less its tier switch: the "
                       f"arms also differ by {' '.join(extra)} (declare the switch in {prof.name!r}'s "
                       "capabilities.tier_flags / tier_env; a slowed baseline is no gain)"))
    if attached and other.launches:
        issues.append((("no_tier_engine",), f"profile {other.name!r} launches its engine (argv); an attached arm "
                       "takes a profile without argv"))
    return issues


def _argv_words(prof: EngineProfile) -> list[str]:
    """Pure: the profile's argv as written (templates unfilled; a structured value as its JSON)."""
    return [a if isinstance(a, str) else json.dumps(a.json_, sort_keys=True) for a in prof.argv]


def arm_difference(tier: EngineProfile, no_tier: EngineProfile) -> dict[str, list[str]]:
    """Pure: how the arm without the tier's launch differs from the tier arm's, as the profiles write them: argv
    words and environment entries (``NAME=value``) only the tier arm has (``tier_only``) and only the other has
    (``no_tier_only``), each in its profile's order (the evidence records it, the report shows it)."""
    out: dict[str, list[str]] = {}
    for key, mine, other in (("argv", _argv_words(tier), _argv_words(no_tier)),
                             ("env", [f"{k}={v}" for k, v in tier.env.items()],
                              [f"{k}={v}" for k, v in no_tier.env.items()])):
        a, b = Counter(mine), Counter(other)
        out[f"tier_only_{key}"] = [w for w in dict.fromkeys(mine) for _ in range((a - b)[w])]
        out[f"no_tier_only_{key}"] = [w for w in dict.fromkeys(other) for _ in range((b - a)[w])]
    return out


def unequal_arms(tier: EngineProfile, no_tier: EngineProfile) -> list[str]:
    """Pure: what the arm without the tier changes beyond the tier switch: every argv word or environment entry of
    :func:`arm_difference` that is not the tier arm's declared switch (``capabilities.tier_flags`` with their
    values, ``capabilities.tier_env``) or its ``no_tier_flag``. Empty: equal arms."""
    cap = tier.capabilities
    words = _argv_words(tier)
    switch = set(cap.tier_flags)
    for i, w in enumerate(words[:-1]):
        if w in cap.tier_flags and not words[i + 1].startswith("-"):
            switch.add(words[i + 1])
    d = arm_difference(tier, no_tier)
    extra = [w for w in d["tier_only_argv"] if w not in switch]
    extra += [w for w in d["no_tier_only_argv"] if w != cap.no_tier_flag]
    for key in ("tier_only_env", "no_tier_only_env"):
        extra += [e for e in d[key] if e.partition("=")[0] not in cap.tier_env]
    return extra


def with_cache(p: GainParams, prof: EngineProfile, extra: list[str] | None = None) -> EngineProfile:
    """Pure: ``prof`` with ``extra`` argv, its engine memory where the gate bounds it, and its LMCache config with
    the gate's ``lmcache_overrides``."""
    cache = ([prof.capabilities.engine_cache_flag, str(engine_cache_value(prof, p.engine_cache_tokens))]
             if p.engine_cache_tokens else [])
    more = cache + list(extra or [])
    if more:
        prof = prof.model_copy(update={"argv": list(prof.argv) + more})
    if p.lmcache_overrides and prof.lmcache is not None:
        lmc = prof.lmcache.model_copy(update={"config": {**prof.lmcache.config, **p.lmcache_overrides}})
        prof = prof.model_copy(update={"lmcache": lmc})
    return prof


def lmcache_override_issues(p: GainParams, prof: EngineProfile) -> list[tuple[tuple, str]]:
    """Pure: what is wrong with the gate's ``lmcache_overrides`` on ``prof``'s LMCache config (by its pinned
    version's key table), each at ``lmcache_overrides.KEY``."""
    if not p.lmcache_overrides:
        return []
    if prof.lmcache is None:
        return [(("lmcache_overrides",), f"profile {prof.name!r} configures no LMCache to override")]
    cfg = {**prof.lmcache.config, **p.lmcache_overrides}
    return [(("lmcache_overrides",) + tuple(path), msg) for path, msg in check_lmcache_config(cfg, prof.lmcache.version)
            if path and path[0] in p.lmcache_overrides]


def arm_prompts(profs: dict[str, EngineProfile], setups: dict[str, Any], vocab_size: int,
                arm_ev: dict[str, G2LoadEvidence]) -> LoadPrompts:
    """Both arms' prompts, the same tokens on both: token ids, or text built with the tokenizer of the arm whose
    API takes text only (then both arms get that text). ValueError when no prompt would suit both arms."""
    text_arm = next((a for a in ARMS if profs[a].api.text_only), None)
    if text_arm is None:
        for a in ARMS:
            arm_ev[a].prompt_kind = "token_ids"
        return LoadPrompts(vocab_size)
    ids_only = [a for a in ARMS if profs[a].capabilities.token_ids_only]
    if ids_only:
        raise ValueError(f"the {text_arm} arm's profile {profs[text_arm].name!r} takes text prompts only, the "
                         f"{ids_only[0]} arm's {profs[ids_only[0]].name!r} token ids only: no prompt suits both")
    prompts = load_prompts(profs[text_arm], setups[text_arm].ev, vocab_size, arm_ev[text_arm])
    for a in ARMS:
        arm_ev[a].prompt_kind, arm_ev[a].tokenizer = arm_ev[text_arm].prompt_kind, arm_ev[text_arm].tokenizer
    return prompts
