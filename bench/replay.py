"""A month of traffic replayed through the running system on CPU, with the headline read
from the ledger and the same replay with each stage switched off.

    .venv/bin/python bench/replay.py [--n 1000] [--seed 0] [--variants full,no_cache,...]
                                     [--screenshot docs/finops-replay.png]
                                     [--prior-months 1]   # steady state: see below
                                     [--ablate full,no_cache,no_routing,no_prefix,no_minify]

Traffic: bench/replay_traffic.py (the bench's own generator, stated there): three tenants,
five workflows of the seed's categories (invoice extraction with a JSON schema, support
answers, ticket triage, SQL analytics, contract Q&A over a ~1k-token contract) with gold
answers and validators, multi-turn support sessions, exact repeats and paraphrases at fixed
rates, batch bursts, timestamps over November 2026 (weekday and business-hour shaped).

System: bench/replay_stack.py: a scratch PostgreSQL database and Redis namespace, the
gateway (gunicorn + uvicorn), a Celery worker with beat, CPU reference engines serving
SmolLM2-135M-Instruct for tier 1 (1 replica) and tier 2 (2 replicas), and as tier 3 a real
HTTP server speaking OpenAI's protocol that answers from the gold set (bench/replay_gold.py,
with a stated latency model). Tiers are priced at the seed's prices ($0.06 / $0.35 / $3.50
per 1M tokens, cached input at a quarter).

Clock: time is compressed. Requests are sent in month order as fast as the system answers
(6 concurrent clients; a session's turns in order, each with the answers it was served).
Every 12 month-hours the bench runs what beat runs on its own (the ledger drain, then
router training for every due scope, as router.schedule_training + router.train do), and
after 48 month-hours it ends the new workflows' frontier-first warm-up (policy
frontier_first_hours 48 -> 0: what the wall clock does in production). Every answer is
checked by its workflow's validator and the verdict sent to POST /v1/feedback, which is
what the router learns from. The router's volume thresholds are scaled to the replay's
size (ROUTER_SCALED in replay_stack.py); its regret bound (0.008 at 95%) is the product's.

Figures: every figure below is a query over the ledger (PostgreSQL rows, kind 'request',
the variant's tenants), not a counter of this script: cost and its frontier baseline,
validator pass rate (the feedback verdicts the drain wrote onto the rows), tier mix,
savings per stage, TTFT. Relative quality = the variant's pass rate / the pass rate of the
rows the frontier served. Variants (each with its own tenants, so caches, routers and
engine prefix caches (salted per tenant) start cold): full; no_cache (cache_enabled off);
no_routing (clients name tier-3: no cascade); no_minify (minify_enabled off); no_prefix
(replica_choice round_robin instead of prefix/session-aware rendezvous);
full_frontier_until_router (the full system with policy frontier_until_router on: no auto
request reaches a cheaper tier before a router version is promoted); and full_adapters
(that, with the LoRA flywheel run during the month through the product's API, tasks and
services: bench/replay_flywheel.py says what the bench clicks and what is scaled).

Steady state (``--prior-months K``): each variant's tenants first replay K months of the
same workflows (their own seeds: other documents, tickets and questions), so the flywheel's
adapters, the routers and the caches carry over into the measured month as they would in
production's second month; the headline, the flywheel table's request and tier-1 columns
and the frontier pass rate are read from the measured month's ledger rows only (booked
after it started). Without it, a month starts cold: traces, training, shadow, approval and
the router's labels take most of it.

Steady-state ablation (``--ablate`` with ``--prior-months``): replaying K prior months per
variant costs about 1.5 h of this box each, and each variant would learn its own adapters
(another draw of the flywheel, not the same system with one stage off). Instead the prior
months run once, through the (one) variant's tenants, and the measured month is then
replayed once per name in --ablate from that state: before each pass the cache's Redis keys
are put back as the prior months left them (what a pass wrote or evicted is dropped) and the
policy is the fork's with the pass's stage switched off; learning is frozen in every pass
(no router training or flywheel step, explore_pct 0), and the report says whether beat's
hourly router training changed a router during a pass. Each pass's figures are read from
its own ledger rows (between its start and its last row). Not reset between passes: the
engines' prefix caches (salted per tenant, LRU) and the adapters' shadow runs.
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import httpx
import orjson

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import replay_flywheel as flywheel  # noqa: E402
import replay_traffic as traffic  # noqa: E402
from replay_ledger import frontier_pass_rate, headline, restamp  # noqa: E402
from replay_stack import ROUTER_SCALED, Stack  # noqa: E402

MONTH_START = datetime(2026, 11, 1, tzinfo=timezone.utc)
PERIOD = "2026-11"
VARIANTS = {  # name -> (tenant policy, model the clients send)
    "full": ({}, "auto"),
    "no_cache": ({"cache_enabled": False}, "auto"),
    "no_routing": ({}, "tier-3"),
    "no_minify": ({"minify_enabled": False}, "auto"),
    "no_prefix": ({"replica_choice": "round_robin"}, "auto"),
    # not a stage switched off: the full system with policy frontier_until_router on
    "full_frontier_until_router": ({"frontier_until_router": True}, "auto"),
    # the full system with the LoRA flywheel run during the month (bench/replay_flywheel.py):
    # frontier until a router is promoted, tier-1 exploration on every request served above
    # tier 1 (policy 5%: too few labels at this scale), the regret bound off (see ADAPTERS_NOTE)
    "full_adapters": ({"frontier_until_router": True, "explore_pct": 100.0,
                       "router_max_regret": 1.0,
                       "distill_min_traces": flywheel.DISTILL_MIN_TRACES}, "auto"),
}
ADAPTERS_NOTE = (
    "full_adapters policy (stated, not the product defaults): frontier_until_router on; "
    "explore_pct 100 (default 5); router_max_regret 1.0, i.e. the regret bound off: the "
    "product's 0.008 at 95% needs >= ~460 clean held-out tier-1 labels in a scope (Clopper-"
    "Pearson), which a month at this scale never has; a version is still promoted only when "
    "its held-out quality reaches ROUTER_QUALITY_TARGET (99% of the frontier's), and the "
    "validators judge every answer below")
HEADLINED = ("full", "full_adapters")
# full_adapters: the compressed clock sends a month in minutes while tier 1 (CPU engines)
# answers an off-path run in seconds; at the product's in-flight caps (explore 4, adapter
# shadow 8 per gateway process) nearly every run was skipped (a first n=600 run: 6 of 95
# invoice requests explored, 0 shadowed). So the caps are raised for this stack and the
# month clock waits at each checkpoint until the tier-1 engines are idle (stated in the output).
OFFPATH_CAPS = {"GATEWAY_EXPLORE_MAX_INFLIGHT": 256, "ADAPTERS_SHADOW_MAX_INFLIGHT": 256}
WARMUP_H, CHECKPOINT_H = 48, 12


def gold_entries(month: traffic.Month) -> list[dict]:
    """What the frontier server knows: last user text, the context that disambiguates it,
    and the gold answer."""
    out, seen = [], set()
    for r in month.requests:
        if r["category"] == "long_context":
            # the whole contract: two contracts (of one month, or of a prior month's seed)
            # may share their title line with other terms
            context = r["system"].split("\n\n", 1)[1].strip()
        elif r["turn"] > 1:
            context = r["prev_user"]
        else:
            context = ""
        key = (r["user"], context)
        if key not in seen:
            seen.add(key)
            out.append({"user": r["user"], "context": context, "gold": r["gold"]})
    return out


def units(month: traffic.Month) -> list[list[dict]]:
    """Requests grouped so that a session's turns go together, in order."""
    by_session: dict[str, list[dict]] = {}
    out: list[list[dict]] = []
    for r in month.requests:
        if r["session"] and r.get("repeat") == "new":
            if r["session"] not in by_session:
                by_session[r["session"]] = []
                out.append(by_session[r["session"]])
            by_session[r["session"]].append(r)
        else:
            out.append([r])
    out.sort(key=lambda u: u[0]["at"])
    return out


async def ask(client: httpx.AsyncClient, key: str, model: str, req: dict,
              history: list[tuple[str, str]]) -> dict:
    messages = [{"role": "system", "content": req["system"]}]
    for user, answer in history:
        messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    messages.append({"role": "user", "content": req["user"]})
    body = {"model": model, "messages": messages, "max_tokens": req["max_tokens"],
            "temperature": 0, "stream": True}
    if req["response_format"]:
        body["response_format"] = req["response_format"]
    headers = {"authorization": f"Bearer {key}", "x-sluice-workflow": req["workflow"]}
    if req["session"]:
        headers["x-sluice-session"] = req["session"]
    parts: list[str] = []
    async with client.stream("POST", "/v1/chat/completions", json=body, headers=headers) as r:
        if r.status_code != 200:
            await r.aread()
            return {"rid": r.headers.get("x-sluice-request-id"), "status": r.status_code,
                    "answer": "", "error": r.text[:200]}
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = orjson.loads(line[6:])
            for ch in ev.get("choices") or ():
                parts.append((ch.get("delta") or {}).get("content") or "")
        rid = r.headers.get("x-sluice-request-id")
    return {"rid": rid, "status": 200, "answer": "".join(parts)}


async def feedback(client: httpx.AsyncClient, key: str, rid: str, passed: bool) -> int:
    """POST /v1/feedback; the request's owner is recorded with its ledger event, a few
    milliseconds after the answer, so a 404 is retried briefly."""
    status = 0
    for _ in range(50):
        r = await client.post("/v1/feedback", headers={"authorization": f"Bearer {key}"},
                              json={"request_id": rid, "verdict": "pass" if passed else "fail"})
        status = r.status_code
        if status != 404:
            break
        await asyncio.sleep(0.1)
    return status


async def run_window(stack: Stack, keys: dict[str, str], model: str, window: list[list[dict]],
                     conc: int, sent: list[dict]) -> None:
    sem = asyncio.Semaphore(conc)
    limits = httpx.Limits(max_connections=conc + 2, max_keepalive_connections=conc + 2)
    async with httpx.AsyncClient(base_url=stack.gateway_url, timeout=600, limits=limits) as client:
        async def one(unit: list[dict]) -> None:
            async with sem:
                history: list[tuple[str, str]] = []
                for req in unit:
                    key = keys[req["tenant"]]
                    got = await ask(client, key, model, req, history)
                    passed = traffic.validate(req, got["answer"]) if got["status"] == 200 else False
                    if got["rid"] and got["status"] == 200:
                        got["feedback"] = await feedback(client, key, got["rid"], passed)
                    sent.append({**got, "at": req["at"], "tenant": req["tenant"],
                                 "category": req["category"], "passed": passed})
                    history.append((req["user"], got["answer"]))
        await asyncio.gather(*(one(u) for u in window))


ABLATION = ("full", "no_cache", "no_minify", "no_prefix", "no_routing")
# an ablation pass: no off-path exploration (its labels would only feed learning, which is
# frozen; its runs would slow tier 1 for the passes after)
ABLATION_FROZEN = {"explore_pct": 0.0}


def replay_variant(stack: Stack, month: traffic.Month, name: str, conc: int,
                   log=print, warmup_h: int = WARMUP_H,
                   checkpoint_h: int = CHECKPOINT_H,
                   prior: list[traffic.Month] | None = None,
                   ablate: list[str] | None = None) -> dict:
    """Replay ``month`` for the variant's own tenants; with ``prior`` months, those are
    replayed first through the same tenants (flywheel, routers and caches carry over) and
    every figure is read from the measured month's rows only (``since``).

    With ``ablate`` (steady state only), the measured month is replayed once per name in it,
    each pass from the same state: the one the prior months left (adapters, routers, the
    cache's Redis keys restored before each pass), with learning frozen (no router training,
    no flywheel step, no exploration) and the pass's stage switched off by its policy (or,
    for no_routing, by the model the clients name). Each pass's figures are read from its
    own rows (``res["ablation"]``: ``since``/``until`` per pass)."""
    policy, model = VARIANTS[name]
    tenants = {t.name: stack.make_tenant(f"{t.name}-{name}", t.department,
                                         {"frontier_first_hours": warmup_h, **policy})
               for t in month.tenants}
    stack.publish()
    ids = [tid for tid, _ in tenants.values()]
    keys = {n: k for n, (_, k) in tenants.items()}
    trained: list[dict] = []
    wheel = flywheel.Flywheel(stack, {n: tid for n, (tid, _) in tenants.items()}, log,
                              prior_months=len(prior or ())) \
        if name == "full_adapters" else None
    offpath_wait = 0.0
    warm = True
    end_h = traffic.MONTH_DAYS * 24
    # passes: (month, None for a prior month, else the measured pass's name)
    passes = [(m, None) for m in prior or ()] + \
        ([(month, v) for v in ablate] if ablate else [(month, name)])
    sent_before = judged_before = 0
    since = None
    sent_prior: list[list[dict]] = []
    ablation: list[dict] = []
    fork: tuple[dict, dict] | None = None     # (policy values, cache keys) at the fork
    for p_i, (this, label) in enumerate(passes):
        measured = label is not None
        m_i = min(p_i, len(prior or ()))          # every ablation pass is the same month
        learn = not ablate or not measured
        if measured and prior:
            # the rows before are all in before the measured month (or this pass) starts
            stack.wait_ledger(ids, sent_before, judged_before)
            if ablate:
                if fork is None:
                    fork = (stack.policy_values(ids[0]), stack.cache_snapshot())
                    log(f"  [{name}] fork: {len(fork[1])} cache keys kept for every pass")
                stack.cache_restore(fork[1])
                stack.set_policy(ids, {**fork[0], **ABLATION_FROZEN, **VARIANTS[label][0]},
                                 replace=True)
                model = VARIANTS[label][1]
                versions0 = stack.router_versions(ids)
            since = datetime.now(timezone.utc)
            if wheel is not None and (not ablate or label == "full"):
                wheel.mark_measured(m_i * end_h)
        all_units = units(this)
        sent: list[dict] = []
        t0 = time.perf_counter()
        paused0 = wheel.paused_s if wheel is not None else 0.0
        wait0 = offpath_wait
        trained_here: list[dict] = []
        for start_h in range(0, end_h, checkpoint_h):
            month_h = m_i * end_h + start_h
            if warm and month_h >= warmup_h:
                stack.set_policy(ids, {"frontier_first_hours": 0})
                warm = False
            lo, hi = start_h * 3600, (start_h + checkpoint_h) * 3600
            window = [u for u in all_units if lo <= u[0]["at"] < hi]
            if window:
                asyncio.run(run_window(stack, keys, model, window, conc, sent))
            if wheel is not None and learn:
                offpath_wait += stack.engines_idle(stack.engine_urls[:stack.t1])
            stack.drain()
            if wheel is not None and learn:
                wheel.step(month_h + checkpoint_h)
                stack.drain()
            if not warm and learn:
                trained_here += [t for t in stack.train_due_routers() if t.get("trained")]
            if start_h % (10 * checkpoint_h) == 0:
                tag = f"month {m_i + 1}/{len(prior or ()) + 1} " if prior else ""
                tag += f"pass {label} " if ablate and measured else ""
                log(f"  [{name}] {tag}day {start_h // 24:2d}: {len(sent)} sent, "
                    f"{time.perf_counter() - t0:.0f} s")
        trained += trained_here
        if not measured or ablate:
            # a prior month, or an ablation pass: the next pass waits for its rows
            if not measured:
                sent_prior.append(sent)
            sent_before += len(sent)
            judged_before += sum(1 for s in sent if s.get("feedback") == 202)
        if measured and ablate:
            wall = time.perf_counter() - t0
            rows = stack.wait_ledger(ids, sent_before, judged_before)
            until = datetime.now(timezone.utc)
            if wheel is not None and label == "full":
                wheel.until = until
            ablation.append({"name": label, "since": since, "until": until, "sent": sent,
                             "wall_s": wall, "ledger_rows": rows - (sent_before - len(sent)),
                             "routers_before": versions0,
                             "routers_after": stack.router_versions(ids)})
            # read now, so a long run's finished passes are in its log
            h = ablation[-1]["headline"] = headline(ids, since=since, until=until)
            log(f"  [{name}] pass {label} done: {h['rows']} rows, cost {fmt_usd(h['cost'])} vs "
                f"{fmt_usd(h['baseline'])} ({h['cut']:.1%} cut), pass rate {h['pass_rate']:.2%}, "
                f"mix {h['mix']}, routers {'unchanged' if versions0 == ablation[-1]['routers_after'] else 'CHANGED'}, "
                f"{wall:.0f} s")
    if ablate:
        stack.set_policy(ids, fork[0], replace=True)
        full = next((a for a in ablation if a["name"] == "full"), ablation[0])
        return {"name": name, "tenant_ids": ids, "sent": full["sent"], "wall_s": full["wall_s"],
                "trained": [], "trained_prior": trained, "since": full["since"],
                "until": full["until"], "prior_months": len(prior or ()),
                "sent_prior": sent_prior, "ledger_rows": full["ledger_rows"],
                "flywheel": wheel.report() if wheel is not None else None,
                "paused_s": 0.0, "paused_prior_s": wheel.paused_s if wheel is not None else 0.0,
                "offpath_wait_s": 0.0, "ablation": ablation}
    wall = time.perf_counter() - t0
    rows = stack.wait_ledger(ids, sent_before + len(sent),
                             judged_before + sum(1 for s in sent if s.get("feedback") == 202))
    return {"name": name, "tenant_ids": ids, "sent": sent, "wall_s": wall,
            "trained": trained_here if prior else trained, "trained_prior": trained,
            "since": since, "prior_months": len(prior or ()), "sent_prior": sent_prior,
            "ledger_rows": rows - sent_before,
            "flywheel": wheel.report() if wheel is not None else None,
            "paused_s": wheel.paused_s - paused0 if wheel is not None else 0.0,
            "paused_prior_s": paused0,
            "offpath_wait_s": offpath_wait - wait0}


def verdict(h: dict, res: dict, frontier: dict) -> list[str]:
    """The issue's target (>= 60% cut at >= 99% relative quality), met or not, and what in
    this run's ledger stands in its way."""
    q = rel(h, frontier)
    out = [f"  target >=60% cut at >=99% relative quality: "
           f"{'met' if h['cut'] >= 0.6 and q >= 0.99 else 'NOT met'} "
           f"({h['cut']:.1%} at {q:.2%})"]
    pools = {k: v for k, v in h["pass_by_tier"].items() if k in ("tier-1", "tier-2")}
    if res["name"] == "full_adapters":
        if h["cut"] < 0.6:
            out.append("    why: the cut comes from the workflows whose adapter passed its gates and "
                       "whose router then sent traffic to tier 1, and only for the part of the "
                       "month after that (traces -> training -> shadow -> approval -> exploration "
                       "labels -> router); per workflow in the flywheel table below")
    elif pools and q < 0.99:
        out.append("    why: the stand-in on tiers 1-2 (SmolLM2-135M, base) passed "
                   + ", ".join(f"{k} {v[0]:.0%} of {v[1]}" for k, v in pools.items())
                   + " of the validated answers it served; every request sent below the "
                     "frontier costs quality at that rate")
    promoted = sum(1 for t in res["trained"] if t.get("status") == "active")
    if not promoted and not res.get("ablation"):
        where = "the frontier (frontier_until_router)" if VARIANTS[res["name"]][0].get(
            "frontier_until_router") else "tier 2 by default (S01_DEFAULT_TIER2)"
        out.append(f"    routers: {len(res['trained'])} versions trained, none promoted, so after "
                   f"the warm-up auto traffic went to {where}")
    return out


def rel(h: dict, frontier: dict) -> float:
    """Relative quality: the variant's pass rate over the frontier's (NaN without one)."""
    return h["pass_rate"] / frontier["rate"] if frontier["rate"] else float("nan")


def fmt_usd(x: Decimal) -> str:
    from app.core.costing import format_usd
    return format_usd(x)


def report(month: traffic.Month, results: list[dict], args, frontier: dict) -> str:
    lines = [__doc__.split("\n\n")[0].strip(), ""]
    st = month.stats
    firsts = st["exact"] + st["paraphrase"] + st["new"]
    lines.append(
        f"month {PERIOD}: {st['requests']} requests (seed {args.seed}); first turns: "
        f"{st['new']} new, {st['exact']} exact repeats ({st['exact'] / firsts:.1%}), "
        f"{st['paraphrase']} paraphrases ({st['paraphrase'] / firsts:.1%}); "
        f"{st['follow_up']} follow-up turns; {st['burst']} in batch bursts")
    lines.append("repeat rates by category (exact, paraphrase of first turns): " + ", ".join(
        f"{c} {e:.0%}/{p:.0%}" for c, (e, p) in traffic.REPEATS.items()))
    lines.append(f"router thresholds scaled to the replay: {ROUTER_SCALED}; "
                 f"checkpoint every {args.checkpoint_h} month-hours; warm-up {args.warmup_h} h")
    k = getattr(args, "prior_months", 0)
    if k:
        lines.append(
            f"steady state: each variant's tenants first replay {k} prior month(s) of the same "
            f"workflows (own seeds {', '.join(str(args.seed + 1000 * (i + 1)) for i in range(k))}: "
            f"other documents, tickets and questions, {args.n} requests each) through the same "
            f"system, so the flywheel, routers and caches carry over as they would into a "
            f"second month; every figure below is from the measured month's ledger rows only")
    lines.append(f"frontier pass rate (rows tier-3 served, {frontier['source']}): "
                 f"{frontier['rate']:.2%} of {frontier['n']}")
    for r in results:
        h = r["headline"]
        if r["name"] not in HEADLINED:
            continue
        what = "full system" if r["name"] == "full" else \
            "full system with the LoRA flywheel run in the month"
        if r.get("ablation"):
            what += (" before it; this is the ablation's full pass, learning frozen in the "
                     "measured month")
        paused = f", of which the month clock was paused {r['paused_s']:.0f} s for training " \
                 f"and {r['offpath_wait_s']:.0f} s waiting for tier 1's off-path runs " \
                 f"(in-flight caps {OFFPATH_CAPS})" if r.get("paused_s") else ""
        lines += ["", f"Headline ({what}: {r['name']}), from the ledger ({h['rows']} request rows "
                      f"for {len(r['sent'])} requests sent; replay {r['wall_s']:.0f} s wall{paused}):"]
        if r["name"] == "full_adapters":
            lines.append("  " + ADAPTERS_NOTE)
        lines.append(f"  cost vs all-frontier       {fmt_usd(h['cost'])} vs "
                     f"{fmt_usd(h['baseline'])}  ({h['cut']:+.1%} cut)")
        lines.append(f"  off-path exploration       {fmt_usd(h['shadow_cost'])} over "
                     f"{h['shadow_rows']} runs (kind shadow, never on a budget); with it "
                     f"the cut is {h['cut_with_shadow']:.1%}")
        lines.append(f"  relative quality           {rel(h, frontier):.2%} "
                     f"(validator pass {h['pass_rate']:.2%} of {h['judged']} judged vs "
                     f"frontier {frontier['rate']:.2%})")
        lines.append("  tier mix                   " + ", ".join(
            f"{k} {v / h['rows']:.1%}" for k, v in h["mix"].items()))
        lines.append(f"  savings per stage ({h['stage_source']}):")
        for s, v in h["stages"].items():
            lines.append(f"      {s:<12} {fmt_usd(v):>14}")
        lines.append(f"      {'sum':<12} {fmt_usd(sum(h['stages'].values(), Decimal(0))):>14}"
                     f"   (baseline - cost = {fmt_usd(h['baseline'] - h['cost'])})")
        lines.append(f"  cost per 1k requests       {fmt_usd(h['per_1k'])} "
                     f"(all-frontier {fmt_usd(h['baseline_per_1k'])})")
        lines.append(f"  TTFT p50 / p95             {h['ttft_p50']:.0f} / {h['ttft_p95']:.0f} ms"
                     f" (gateway-measured, cache hits included)")
        lines.append(f"  pass rate by tier served   " + ", ".join(
            f"{k} {v[0]:.0%} of {v[1]}" for k, v in h["pass_by_tier"].items()))
        lines.append("  by how S01 chose (rows, validator pass, cost vs its all-frontier baseline):")
        for reason, (n, ok, judged, c, b) in sorted(h["phases"].items(), key=lambda kv: -kv[1][0]):
            lines.append(f"      {reason:<15} {n:>5} rows  pass {ok / judged if judged else 0:7.2%}"
                         f"  cost {fmt_usd(c):>12} vs {fmt_usd(b):>12}"
                         f"  ({1 - c / b if b else 0:+.1%} cut)")
        lines.append(f"  escalations (margin)       {h['escalated']}; routers promoted "
                     f"{sum(1 for t in r['trained'] if t.get('status') == 'active')} of "
                     f"{len(r['trained'])} versions trained"
                     + (f" in the measured month ({sum(1 for t in r['trained_prior'] if t.get('status') == 'active')}"
                        f" of {len(r['trained_prior'])} with the prior months; training paused the "
                        f"prior months' clock {r['paused_prior_s']:.0f} s)" if r.get("prior_months") else "")
                     + ("; learning frozen in this pass (see the ablation below)"
                        if r.get("ablation") else ""))
        lines += verdict(h, r, frontier)
        if r.get("flywheel"):
            lines += [""] + r["flywheel"]
    start = f"after {k} prior month(s)" if k else "cold start"
    passes = [(r["name"], a) for r in results for a in r.get("ablation") or ()]
    if passes:
        lines += ["", f"Ablation: the measured month replayed once per row through the "
                      f"{passes[0][0]} tenants, every pass from the state the {k} prior month(s) "
                      f"left (adapters, routers, and the cache's Redis keys restored before each "
                      f"pass), learning frozen (no router training, no flywheel step, exploration "
                      f"off), the row's stage switched off; from each pass's own ledger rows:"]
        rows = [(a["name"], a) for _, a in passes]
    else:
        lines += ["", f"Ablation: the same month, each stage off (own tenants, {start}), "
                      f"from the ledger:"]
        rows = [(r["name"], r) for r in results]
    lines.append(f"  {'variant':<11} {'rows':>5} {'cost':>12} {'cut':>7} {'rel.q':>7} "
                 f"{'cache':>6} {'T1':>6} {'T2':>6} {'T3':>6} {'$/1k':>10} {'p50 ms':>7} "
                 f"{'p95 ms':>7} {'wall s':>6}")
    for n, r in rows:
        h = r["headline"]
        hits = h["mix"].get("cache exact", 0) + h["mix"].get("cache semantic", 0)
        lines.append(
            f"  {n:<11} {h['rows']:>5} {fmt_usd(h['cost']):>12} {h['cut']:>7.1%} "
            f"{rel(h, frontier):>7.2%} {hits / h['rows']:>6.1%} "
            + " ".join(f"{h['mix'].get(t, 0) / h['rows']:>6.1%}" for t in ("tier-1", "tier-2", "tier-3"))
            + f" {fmt_usd(h['per_1k']):>10} {h['ttft_p50']:>7.0f} {h['ttft_p95']:>7.0f} "
            f"{r['wall_s']:>6.0f}")
    if passes:
        lines.append("  each stage's share, as the pass with it off costs more than the full pass "
                     "(the ledger's per-stage savings of the full pass beside it):")
        full = rows[0][1]["headline"]
        stage_of = {"no_cache": "cache", "no_routing": "routing", "no_minify": "minify",
                    "no_prefix": "prefix"}
        for n, a in rows:
            if n in stage_of:
                extra = a["headline"]["cost"] - full["cost"]
                lines.append(f"      {stage_of[n]:<8} off: +{fmt_usd(extra)} "
                             f"({a['headline']['cost'] / full['cost'] if full['cost'] else 0:.2f}x "
                             f"the full pass's cost); the ledger's {stage_of[n]} savings in the "
                             f"full pass {fmt_usd(full['stages'].get(stage_of[n], Decimal(0)))}")
        for n, a in rows:
            before, after = a["routers_before"], a["routers_after"]
            changed = {s: (before.get(s), v) for s, v in after.items() if before.get(s) != v}
            lines.append(f"  routers during pass {n}: " + (
                "unchanged" if not changed else "CHANGED (beat's hourly training): " + ", ".join(
                    f"{s} v{b}->v{v}" for s, (b, v) in changed.items())))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=1000, help="requests in the month")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", default=",".join(v for v in VARIANTS if v.startswith("no_")
                                                  or v == "full"))
    ap.add_argument("--conc", type=int, default=6)
    ap.add_argument("--t1-replicas", type=int, default=1)
    ap.add_argument("--t2-replicas", type=int, default=2)
    ap.add_argument("--screenshot", default="", help="PNG path for the FinOps page")
    ap.add_argument("--keep", action="store_true", help="keep the scratch database")
    ap.add_argument("--warmup-h", type=int, default=WARMUP_H,
                    help="month-hours of frontier-first warm-up (policy default 48)")
    ap.add_argument("--checkpoint-h", type=int, default=CHECKPOINT_H,
                    help="month-hours between the compressed clock's drain + router training")
    ap.add_argument("--engine-model", default="smollm2",
                    help="what the tier 1-2 engines serve (the test: a tiny random Llama)")
    ap.add_argument("--out", default="", help="also write the report here after each variant")
    ap.add_argument("--prior-months", type=int, default=0,
                    help="months replayed first through each variant's tenants (steady state: "
                         "flywheel, routers and caches carry over); figures from the last only")
    ap.add_argument("--ablate", default="",
                    help="with --prior-months: replay the measured month once per stage-off "
                         f"variant from the state the prior months left, learning frozen "
                         f"(e.g. {','.join(ABLATION)}); the table's rows")
    ap.add_argument("--distill-min-traces", type=int, default=flywheel.DISTILL_MIN_TRACES,
                    help="full_adapters: the tenants' distill_min_traces (scaled)")
    ap.add_argument("--train-budget-s", type=float, default=flywheel.TRAIN_BUDGET_S,
                    help="full_adapters: seconds of training (clock paused) before no more is asked")
    ap.add_argument("--shadow-min", type=int, default=flywheel.SHADOW_MIN_REQUESTS,
                    help="full_adapters: shadowed answers before the shadow gate (scaled)")
    args = ap.parse_args(argv)
    import signal
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # stop the stack on a kill
    import logging
    logging.basicConfig(level=logging.WARNING)
    for name in ("httpx", "app"):
        logging.getLogger(name).setLevel(logging.WARNING)
    result = run(args)
    print(result["text"])
    return 0


def run(args, *, keep_stack: bool = False) -> dict:
    flywheel.DISTILL_MIN_TRACES = getattr(args, "distill_min_traces", flywheel.DISTILL_MIN_TRACES)
    flywheel.SHADOW_MIN_REQUESTS = getattr(args, "shadow_min", flywheel.SHADOW_MIN_REQUESTS)
    flywheel.TRAIN_BUDGET_S = getattr(args, "train_budget_s", flywheel.TRAIN_BUDGET_S)
    VARIANTS["full_adapters"][0]["distill_min_traces"] = flywheel.DISTILL_MIN_TRACES
    month = traffic.generate(args.n, args.seed)
    # prior months: the same tenants and workflows, other documents and tickets (own seeds)
    prior = [traffic.generate(args.n, args.seed + 1000 * (k + 1))
             for k in range(getattr(args, "prior_months", 0))]
    for m in prior + [month]:
        for r in m.requests:     # the previous turn's text: the frontier's context key
            r.setdefault("prev_user", "")
        prev: dict[str, str] = {}
        for r in m.requests:
            if r["session"] and r.get("repeat") == "new":
                r["prev_user"] = prev.get(r["session"], "")
                prev[r["session"]] = r["user"]
    adapters = "full_adapters" in args.variants.split(",")
    gold = [e for m in prior + [month] for e in gold_entries(m)]
    stack = Stack(gold, args.t1_replicas, args.t2_replicas,
                  engine_model=args.engine_model,
                  gateway_overrides=OFFPATH_CAPS if adapters else None)
    try:
        stack.start()
        print(f"stack up: gateway {stack.gateway_url}, {len(stack.engine_urls)} engines, "
              f"db {stack.db_name}", flush=True)
        results = []
        names = args.variants.split(",")
        ablate = [v for v in getattr(args, "ablate", "").split(",") if v] or None
        if ablate and (not prior or set(ablate) - set(VARIANTS)):
            raise SystemExit(f"--ablate takes --prior-months >= 1 and names of {list(VARIANTS)}")
        shot_of = next((n for n in HEADLINED if n in names), names[0])   # the page's variant
        for name in names:
            res = replay_variant(stack, month, name, args.conc,
                                 log=lambda m: print(m, flush=True), warmup_h=args.warmup_h,
                                 checkpoint_h=args.checkpoint_h, prior=prior, ablate=ablate)
            for a in res.get("ablation") or ():
                a["frontier"] = frontier_pass_rate(res["tenant_ids"], since=a["since"],
                                                   until=a["until"])
            res["headline"] = headline(res["tenant_ids"], since=res["since"],
                                       until=res.get("until"))
            # before the screenshot restamps the rows to month time (``since`` is wall time)
            res["frontier"] = frontier_pass_rate(res["tenant_ids"], since=res["since"],
                                                 until=res.get("until"))
            if res.get("ablation"):
                # the frontier's pass rate: the pass that sent everything to it, if any
                res["frontier"] = next((a["frontier"] for a in res["ablation"]
                                        if a["name"] == "no_routing"), res["frontier"])
            results.append(res)
            print(f"  [{name}] done: {res['ledger_rows']} ledger rows, "
                  f"{res['wall_s']:.0f} s", flush=True)
            if name == shot_of and args.screenshot:
                from replay_console import screenshot
                # after its headline: the console's month view only; prior months go to
                # the months before (the 12-month view shows them)
                restamp(res["sent"], MONTH_START)
                for i, earlier in enumerate(res["sent_prior"]):
                    restamp(earlier, MONTH_START - timedelta(
                        days=traffic.MONTH_DAYS * (len(res["sent_prior"]) - i)))
                screenshot(stack, PERIOD, args.screenshot)
            by_name = {r["name"]: r for r in results}
            src = "no_routing" if "no_routing" in by_name else results[0]["name"]
            if ablate and "no_routing" in ablate:
                src = f"{results[0]['name']}'s no_routing pass"
            frontier = {**by_name.get("no_routing", results[0])["frontier"], "source": src}
            text = report(month, results, args, frontier)
            if args.screenshot and shot_of in by_name:
                text += (f"\n\nFinOps page of the replayed month ({shot_of} variant): "
                         f"{args.screenshot}")
            if args.out:
                Path(args.out).write_text(text + "\n")
        return {"text": text, "results": results, "frontier": frontier, "month": month,
                "stack": stack if keep_stack else None}
    finally:
        if not keep_stack:
            stack.stop(keep_db=args.keep)


if __name__ == "__main__":
    sys.exit(main())
