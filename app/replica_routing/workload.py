"""Seed-like workloads for the prefix-routing simulator. Pure (seeded RNG, no I/O).

The "seed" preset follows the seed text: 14 product teams, each with a 4,500-token static
prefix (instructions + few-shot, then a block of 32 tool definitions at 80 tokens each),
the five cohorts of the seed's telemetry matrix (6.3) with their token shares, multi-turn
sessions whose history grows to the ~12,000 tokens FL-28B says round-robin re-computed on
every turn, Zipf popularity of teams inside each cohort, rate bursts, and batch jobs that
arrive all at once.

What a session turn adds is what these applications send: support (RAG) turns carry a
follow-up question plus ~1k tokens of retrieved passages, code/SQL agent steps carry tool
results (schemas, file excerpts, query output) and come seconds apart, legal/financial
reasoning opens with a ~4k-token document. A session ends at the context a Tier-1 8B model
is usually served with (``MAX_CONTEXT``). Sizes were set from these facts and checked
against the seed's per-cohort prefix hit rates on one node with ample cache (extraction
92%, support 88%, code 85%, reasoning 81%, batch 94%; 89% overall, FL-28B's single-node
figure); how much survives on N replicas is what the simulator measures, and the preset
was not tuned to any policy's result there.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

STATIC_INSTRUCTIONS = 1940
TOOLS = 32
TOKENS_PER_TOOL = 80          # 1,940 + 32 x 80 = 4,500


@dataclass(frozen=True)
class Cohort:
    name: str
    teams: int
    token_share: float        # seed 6.3
    sessions: bool
    mean_turns: float         # geometric; 1 for single-shot
    first_tokens: tuple[float, float]   # lognormal (median, sigma) of turn 1's new tokens
    turn_tokens: tuple[float, float]    # later turns' new user/tool tokens
    output_tokens: tuple[float, float]
    think_s: float            # mean pause between a reply and the next turn


COHORTS = (
    Cohort("structured_extraction", 4, 0.36, False, 1, (330, 0.45), (0, 0), (110, 0.4), 0),
    # question + retrieved passages, then follow-ups that retrieve again
    Cohort("support_rag", 4, 0.28, True, 6, (1400, 0.35), (950, 0.4), (220, 0.4), 25),
    # agent loop: each step sends the tool's result back a few seconds later
    Cohort("code_sql", 3, 0.20, True, 7, (1500, 0.5), (1300, 0.6), (300, 0.5), 6),
    # a long document first, short follow-ups
    Cohort("complex_reasoning", 2, 0.10, True, 4, (4000, 0.5), (450, 0.5), (480, 0.4), 40),
    Cohort("batch_summarization", 1, 0.06, False, 1, (260, 0.4), (0, 0), (140, 0.3), 0),
)
MAX_CONTEXT = 32_768          # max_model_len of a Tier-1 8B replica: the session ends there


def _lognormal(rng: random.Random, median_sigma: tuple[float, float]) -> int:
    median, sigma = median_sigma
    return max(1, int(rng.lognormvariate(math.log(median), sigma))) if median else 0


def _zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (k + 1) ** s for k in range(n)]


def _static(team: str) -> list[list]:
    return [[f"{team}:sys", STATIC_INSTRUCTIONS], [f"{team}:tools32", TOOLS * TOKENS_PER_TOOL]]


def _session(rng: random.Random, c: Cohort, team: str, sid: str | None, uid: int, t0: float,
             prefill_guess_ms: float = 4000.0) -> list[dict]:
    turns = 1 if not c.sessions else min(40, 1 + int(rng.expovariate(1 / (c.mean_turns - 1))))
    segs = _static(team)
    out, t = [], t0
    for turn in range(turns):
        new = _lognormal(rng, c.first_tokens if turn == 0 else c.turn_tokens)
        output = _lognormal(rng, c.output_tokens)
        if turn and sum(n for _, n in segs) + new + output > MAX_CONTEXT:
            break
        segs = segs + [[f"c{uid}:u{turn}", new]]
        out.append({"arrival_ms": round(t, 1), "session_id": sid, "segments": segs,
                    "output_tokens": output, "team": team, "cohort": c.name})
        if turn == turns - 1:
            break
        segs = segs + [[f"c{uid}:a{turn}", output]]
        # the next turn comes after the reply (roughly) plus the user's think time
        t += prefill_guess_ms + 1000.0 * (2 + rng.expovariate(1 / c.think_s))
    return out


BATCH_JOB = (100, 300)        # requests per batch job


BURST_FACTOR, BURST_MS, CALM_MS = 3.0, 60_000, 300_000


def _turns_mean(c: Cohort) -> float:
    # 1 + int(Exp(mean_turns - 1)): the floor of an exponential has mean 1/(e^(1/m) - 1)
    return 1 + 1 / math.expm1(1 / (c.mean_turns - 1)) if c.sessions else 1


def _requests_per_start(c: Cohort) -> float:
    if c.name == "batch_summarization":
        return sum(BATCH_JOB) / 2
    return _turns_mean(c)


def _mean(median_sigma: tuple[float, float]) -> float:
    return median_sigma[0] * math.exp(median_sigma[1] ** 2 / 2)


def _mean_tokens_per_start(c: Cohort) -> float:
    first = _mean(c.first_tokens) + 4500
    if not c.sessions:
        return first * _requests_per_start(c)
    turns, per_turn = _turns_mean(c), _mean(c.turn_tokens) + _mean(c.output_tokens)
    return turns * first + per_turn * turns * (turns - 1) / 2


# The seed's traffic reaching one 8-replica Tier-1 pool: 125M requests/month (48/s), less
# the 18.4% semantic-cache hits, times the 64.2% Tier-1 share.
SEED_TIER1_RPS = round(125e6 / (30 * 86400) * (1 - 0.184) * 0.642, 1)


def seed_workload(requests: int = 20_000, *, rate_rps: float = SEED_TIER1_RPS,
                  zipf_s: float = 1.1, seed: int = 28) -> list[dict]:
    """``requests`` requests of the seed preset, sorted by arrival.

    ``rate_rps`` is the long-run mean request rate; bursts (1 minute after each calm
    spell of 5 minutes on average) run at 3x the calm rate, and the batch cohort arrives
    as jobs of 100-300 requests within 20 s. Sessions are whole (the last one started
    may be cut short to make the count). Extra keys ``team`` and ``cohort`` ride
    along (the simulator ignores them)."""
    rng = random.Random(seed)
    teams = []
    n = 0
    for c in COHORTS:
        names = [f"team{n + i + 1:02d}" for i in range(c.teams)]
        n += c.teams
        rng.shuffle(names)                            # which team is hot is arbitrary
        teams.append((c, names, _zipf_weights(c.teams, zipf_s)))
    # start probability per cohort so its token share matches the seed's matrix
    start_w = [c.token_share / _mean_tokens_per_start(c) for c in COHORTS]
    mean_reqs = sum(w * _requests_per_start(c) for w, c in zip(start_w, COHORTS)) / sum(start_w)
    burst_share = BURST_MS / (BURST_MS + CALM_MS)
    calm_rps = rate_rps / (1 + (BURST_FACTOR - 1) * burst_share)
    start_rate = calm_rps / mean_reqs / 1000.0        # starts per ms
    out: list[dict] = []
    t, burst_until, next_burst = 0.0, -1.0, rng.expovariate(1 / CALM_MS)
    uid = 0
    while len(out) < requests:
        boost = BURST_FACTOR if t < burst_until else 1.0
        t += rng.expovariate(start_rate * boost)
        if t > next_burst:
            burst_until = t + BURST_MS
            next_burst = burst_until + rng.expovariate(1 / CALM_MS)
        c, names, zw = teams[rng.choices(range(len(COHORTS)), weights=start_w)[0]]
        team = rng.choices(names, weights=zw)[0]
        if c.name == "batch_summarization":
            for _ in range(rng.randint(*BATCH_JOB)):
                uid += 1
                out += _session(rng, c, team, None, uid, t + rng.uniform(0, 20_000))
            continue
        uid += 1
        out += _session(rng, c, team, f"s{uid}" if c.sessions else None, uid, t)
    # cut in order of session start, so every session is whole but the last: cutting by
    # arrival would drop the later turns of every session still running at the end and
    # leave a window of mostly first turns
    out = out[:requests]
    out.sort(key=lambda r: r["arrival_ms"])
    return out


LINE_KEYS = ("arrival_ms", "session_id", "segments", "output_tokens")


def to_lines(rows: list[dict]) -> list[str]:
    """The workload file format: one JSON object per line with exactly ``LINE_KEYS``."""
    import json
    return [json.dumps({k: r[k] for k in LINE_KEYS}, separators=(",", ":")) for r in rows]


# Shapes beside the seed preset (issue 17), each a prefix tree the gateway meets in
# multi-tenant pools. A request's segments are the path from the root: shared preamble(s),
# then the app's own prompt, then its tool block, then the session's turns.
@dataclass(frozen=True)
class Shape:
    preamble: int              # organisation-wide preamble every request starts with (0: none)
    apps: int                  # per-app system prompts under it
    app_tokens: int
    toolsets: int              # tool blocks per app (branches under each app prompt)
    tool_tokens: int
    hot_share: float           # share of sessions of app 0 (0: Zipf over apps)
    mean_turns: float
    first_tokens: tuple[float, float]
    turn_tokens: tuple[float, float]
    output_tokens: tuple[float, float]
    think_s: float
    rate_rps: float
    session_ids: float = 0.0   # share of sessions whose client names them (X-Sluice-Session)


SHAPES = {
    # organisation preamble -> 8 app prompts -> 6 tool blocks each -> agent sessions
    "deep_tree": Shape(2500, 8, 1500, 6, 1200, 0.0, 6, (900, 0.5), (600, 0.5), (180, 0.4),
                       8, 4.0, 0.0),
    # 40 tenants' short chats: 1-3 turns, small prompts, many users at once
    "short_sessions": Shape(0, 40, 1200, 2, 600, 0.0, 2, (250, 0.5), (200, 0.5),
                            (120, 0.4), 10, 12.0, 0.5),
    # one tenant sends 60% of the sessions; the rest share the remainder by Zipf
    "hot_tenant": Shape(800, 12, 2500, 3, 1500, 0.6, 5, (700, 0.5), (500, 0.5), (200, 0.4),
                        15, 5.0, 0.3),
}


def shaped_workload(shape: str, requests: int = 6000, *, seed: int = 17,
                    rate_rps: float | None = None) -> list[dict]:
    """``requests`` requests of ``SHAPES[shape]``, sorted by arrival; sessions are whole
    (the last one started may be cut short)."""
    s = SHAPES[shape]
    rng = random.Random(seed)
    if s.hot_share:
        rest = _zipf_weights(s.apps - 1, 1.0)
        app_w = [s.hot_share] + [w / sum(rest) * (1 - s.hot_share) for w in rest]
    else:
        app_w = _zipf_weights(s.apps, 0.8)
    turns_mean = 1 + 1 / math.expm1(1 / (s.mean_turns - 1))
    start_rate = (rate_rps or s.rate_rps) / turns_mean / 1000.0      # sessions per ms
    out: list[dict] = []
    t, uid = 0.0, 0
    while len(out) < requests:
        t += rng.expovariate(start_rate)
        app = rng.choices(range(s.apps), weights=app_w)[0]
        tools = rng.randrange(s.toolsets)
        segs = ([["org:preamble", s.preamble]] if s.preamble else []) + [
            [f"app{app}:sys", s.app_tokens], [f"app{app}:tools{tools}", s.tool_tokens]]
        uid += 1
        sid = f"s{uid}" if rng.random() < s.session_ids else None
        turns = min(40, 1 + int(rng.expovariate(1 / (s.mean_turns - 1))))
        at = t
        for turn in range(turns):
            new = _lognormal(rng, s.first_tokens if turn == 0 else s.turn_tokens)
            output = _lognormal(rng, s.output_tokens)
            if turn and sum(n for _, n in segs) + new + output > MAX_CONTEXT:
                break
            segs = segs + [[f"c{uid}:u{turn}", new]]
            out.append({"arrival_ms": round(at, 1), "session_id": sid, "segments": segs,
                        "output_tokens": output, "team": f"app{app}", "cohort": shape})
            segs = segs + [[f"c{uid}:a{turn}", output]]
            at += 3000.0 + 1000.0 * rng.expovariate(1 / s.think_s)
    out = out[:requests]
    out.sort(key=lambda r: r["arrival_ms"])
    return out
