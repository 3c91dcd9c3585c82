"""Chaos drill CD-28B: a sudden novel domain in a simple workflow, through a running gateway.

Sends in-domain control prompts and complex out-of-domain prompts with the same system
prompt and response schema (so the same workflow), streamed, with ``model="auto"``, and
measures per group the escalation rate and latency. "No aborted-tier byte reached the
client" is checked on the client side: the chunks of one streamed answer must all carry
one completion ``id`` and one ``model`` (an attempt the gateway aborted and replaced
would show a second id), and no chunk may be an error event.

Escalation per request is read from the ``x-sluice-escalated`` response header (Sluice's
gateway sends it; S04 decides before the first byte), else from the ledger row of
``x-sluice-request-id`` (escalated flag), waiting a bounded time for the ledger drain.
The result keeps every request briefly (``requests``: group, id, tier, escalated, latency,
leaked, the first characters of the answer the client read). Recording a run is
``app.cascade.drill_runs.record_domain_shift``.

Task accuracy with and without the monitor (issue 24, optional): every prompt is also sent
to the tier the router sends the simple workflow to, by name (no margin monitor: what the
client would get if nothing escalated), and to a reference tier (the frontier); the routed
answer and the unmonitored one are each judged against the reference's answer with the
rule of ``_judge``. The result's ``accuracy`` gives both, per group.
"""
from __future__ import annotations

import json
import random
import statistics
import time
from typing import Any, Callable, Iterator

import httpx

from app.core.concordance import json_field_match, normalize_text

SYSTEM = ("You extract invoice fields. Reply with JSON only: "
          '{"invoice_number": string, "city": string, "amount": number}.')
SCHEMA = {"type": "json_schema", "json_schema": {"name": "invoice", "strict": True, "schema": {
    "type": "object", "additionalProperties": False,
    "required": ["invoice_number", "city", "amount"],
    "properties": {"invoice_number": {"type": "string"}, "city": {"type": "string"},
                   "amount": {"type": "number"}}}}}
ANSWER_HEAD = 80  # characters of each answer kept in the run record
_CITIES = ["Lyon", "Porto", "Graz", "Utrecht", "Leeds", "Bilbao", "Turku", "Brno"]
_LEGAL = [
    "Under a 2002 ISDA Master Agreement with an English-law CSA, Counterparty {a} novates a "
    "{y}-year EUR/USD cross-currency swap to {b} after a Credit Support Default; {b}'s guarantor "
    "sits in a jurisdiction with no netting opinion. Who bears the Section 6(e) close-out amount, "
    "and does contractual set-off survive the novation if {a} later enters administration?",
    "A Delaware SPV issues credit-linked notes referencing {a}; {a} merges into {b}, which then "
    "defaults on a bond that is pari passu with the reference obligation. Given the 2014 ISDA "
    "Credit Derivatives Definitions' successor provisions, is there a Credit Event for the notes, "
    "and how would an Article 55 BRRD bail-in of {b} change the recovery waterfall?",
    "Invoice-like text aside: if a variation-margin dispute under a {y}-year total return swap "
    "between {a} and {b} is referred to the ISDA Determinations Committee while an EMIR "
    "clearing obligation applies, which forum's ruling controls, and what are the implications "
    "for the Early Termination Date if {b} contests the Valuation Agent's quotes?",
    "Compare how a New York court and an English court would treat a flawed-asset Section 2(a)(iii) "
    "suspension by {a} against {b} that lasted {y} years, and explain whether the Lomas v Firth "
    "Rixson reasoning would bar {b} from claiming default interest on the suspended payments.",
]
_PARTIES = ["Halvard Capital", "Norrmark Bank", "Ostrava Re", "Castellan AG", "Meridian Trust",
            "Vexa Holdings", "Quarry Lane LLP", "Brightwater SA"]


def control_prompt(rng: random.Random) -> str:
    return (f"Invoice INV-{rng.randint(1000, 99999)} issued in {rng.choice(_CITIES)}, "
            f"total due {rng.randint(10, 9999)}.{rng.randint(0, 99):02d} EUR.")


def ood_prompt(rng: random.Random) -> str:
    a, b = rng.sample(_PARTIES, 2)
    return rng.choice(_LEGAL).format(a=a, b=b, y=rng.randint(2, 30))


def _sse_events(resp: httpx.Response) -> Iterator[dict]:
    for line in resp.iter_lines():
        if not line.startswith("data: "):
            continue
        data = line[6:].strip()
        if data == "[DONE]":
            return
        try:
            yield json.loads(data)
        except ValueError:
            yield {"error": {"message": "unparseable event", "code": "bad_event"}}


def send(client: httpx.Client, url: str, key: str, prompt: str, workflow: str,
         max_tokens: int, model: str = "auto") -> dict[str, Any]:
    """One streamed request; what the client saw. ``model``: "auto" (routed, the margin
    monitor on) or a tier name (that tier answers, no monitor)."""
    body = {"model": model, "stream": True, "max_tokens": max_tokens, "temperature": 0,
            "response_format": SCHEMA,
            "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": prompt}]}
    headers = {"Authorization": f"Bearer {key}", "X-Sluice-Workflow": workflow}
    t0 = time.perf_counter()
    ids, models, errors, content, ttft = set(), set(), 0, [], None
    with client.stream("POST", url.rstrip("/") + "/v1/chat/completions", json=body,
                       headers=headers) as resp:
        status = resp.status_code
        h = resp.headers
        if status == 200:
            for ev in _sse_events(resp):
                if "error" in ev:
                    errors += 1
                    continue
                ids.add(ev.get("id"))
                models.add(ev.get("model"))
                for ch in ev.get("choices") or []:
                    piece = (ch.get("delta") or {}).get("content")
                    if piece:
                        ttft = ttft if ttft is not None else (time.perf_counter() - t0) * 1000
                        content.append(piece)
        else:
            resp.read()
    text = "".join(content)
    try:
        json.loads(text)
        valid = True
    except ValueError:
        valid = False
    esc = h.get("x-sluice-escalated")
    return {"status": status, "request_id": h.get("x-sluice-request-id"),
            "tier": h.get("x-sluice-tier", ""),
            "escalated": None if esc is None else esc.lower() in ("1", "true", "yes"),
            "latency_ms": (time.perf_counter() - t0) * 1000, "ttft_ms": ttft,
            "ids": len(ids - {None}), "models": len(models - {None}), "error_events": errors,
            "json_valid": valid, "answer_head": text[:ANSWER_HEAD], "answer": text}


def leaked(r: dict[str, Any]) -> bool:
    """Bytes of more than one attempt (two completion ids or models) or an error event."""
    return r["status"] == 200 and (r["ids"] > 1 or r["models"] > 1 or r["error_events"] > 0)


def _group(rows: list[dict]) -> dict[str, Any]:
    ok = [r for r in rows if r["status"] == 200]
    known = [r for r in ok if r["escalated"] is not None]
    lat = [r["latency_ms"] for r in ok]
    tiers: dict[str, int] = {}
    for r in ok:
        tiers[r["tier"]] = tiers.get(r["tier"], 0) + 1
    return {"requests": len(rows), "ok": len(ok),
            "escalated": sum(bool(r["escalated"]) for r in known), "escalation_known": len(known),
            "escalation_rate": (sum(bool(r["escalated"]) for r in known) / len(known)) if known else None,
            "latency_ms_mean": statistics.fmean(lat) if lat else None,
            "latency_ms_p50": statistics.median(lat) if lat else None,
            "json_valid": sum(r["json_valid"] for r in ok), "tiers": tiers,
            "leaks": sum(leaked(r) for r in rows)}


def _judge(reference: str, candidate: str) -> bool:
    """Whether ``candidate`` gives the reference's answer: a JSON object field by field
    (the adapter shadow's ``json_fields`` rule), other text equal once normalized (an
    extraction has one right answer, so no partial credit for sharing most words)."""
    try:
        is_json = isinstance(json.loads(reference), dict)
    except ValueError:
        is_json = False
    if is_json:
        return json_field_match(reference, candidate)[1]
    return normalize_text(reference) == normalize_text(candidate)


def _rate(flags: list[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def task_accuracy(client: httpx.Client, url: str, key: str, jobs: list[tuple[str, str, dict]],
                  workflow: str, max_tokens: int, unmonitored_tier: str,
                  reference_tier: str) -> dict[str, Any]:
    """Task accuracy of the routed answers (the margin monitor on) and of the same prompts
    answered by ``unmonitored_tier`` with no monitor (what the router's tier gives when
    nothing escalates), each judged against ``reference_tier``'s answer to the prompt (the
    frontier as the judge). ``jobs``: (group, prompt, routed result)."""
    marks: dict[str, dict[str, list[bool]]] = {"with_monitor": {}, "without_monitor": {}}
    for group, prompt, routed in jobs:
        if routed.get("status") != 200:
            continue
        ref = send(client, url, key, prompt, workflow, max_tokens, model=reference_tier)
        bare = send(client, url, key, prompt, workflow, max_tokens, model=unmonitored_tier)
        if ref["status"] != 200:
            continue
        marks["with_monitor"].setdefault(group, []).append(_judge(ref["answer"], routed["answer"]))
        if bare["status"] == 200:
            marks["without_monitor"].setdefault(group, []).append(
                _judge(ref["answer"], bare["answer"]))
    out: dict[str, Any] = {"judged_by": reference_tier, "unmonitored_tier": unmonitored_tier}
    for mode, by_group in marks.items():
        every = [m for flags in by_group.values() for m in flags]
        out[mode] = {"ood": _rate(by_group.get("ood", [])), "control": _rate(by_group.get(
            "control", [])), "all": _rate(every), "n": len(every)}
    return out


def run_domain_shift(url: str, key: str, *, n_ood: int, n_control: int, workflow: str,
                     max_tokens: int = 64, timeout_s: float = 120.0, seed: int = 0,
                     escalation_lookup: Callable[[list[dict]], None] | None = None,
                     unmonitored_tier: str | None = None, reference_tier: str | None = None
                     ) -> dict[str, Any]:
    """Run the drill; ``escalation_lookup`` fills ``escalated`` where headers did not
    (ledger). With ``unmonitored_tier`` and ``reference_tier``, also the task accuracy
    with and without the monitor (``task_accuracy``; two more requests per prompt)."""
    rng = random.Random(seed)
    jobs = [("control", control_prompt(rng)) for _ in range(n_control)] + \
           [("ood", ood_prompt(rng)) for _ in range(n_ood)]
    rng.shuffle(jobs)
    rows: dict[str, list[dict]] = {"control": [], "ood": []}
    accuracy = None
    with httpx.Client(timeout=httpx.Timeout(timeout_s, connect=5.0)) as client:
        for group, prompt in jobs:
            try:
                rows[group].append(send(client, url, key, prompt, workflow, max_tokens))
            except httpx.HTTPError as exc:
                rows[group].append({"status": 0, "error": str(exc)[:200], "escalated": None,
                                    "latency_ms": None, "ids": 0, "models": 0, "error_events": 0,
                                    "json_valid": False, "tier": "", "request_id": None})
        if unmonitored_tier and reference_tier:
            done = {g: iter(rs) for g, rs in rows.items()}
            try:
                accuracy = task_accuracy(client, url, key,
                                         [(g, p, next(done[g])) for g, p in jobs], workflow,
                                         max_tokens, unmonitored_tier, reference_tier)
            except httpx.HTTPError as exc:
                accuracy = {"error": str(exc)[:200]}
    if escalation_lookup is not None:
        escalation_lookup([r for g in rows.values() for r in g if r["escalated"] is None])
    ood, control = _group(rows["ood"]), _group(rows["control"])
    esc_lat = [r["latency_ms"] for r in rows["ood"] if r.get("escalated") and r["status"] == 200]
    added = (statistics.fmean(esc_lat) - control["latency_ms_mean"]
             if esc_lat and control["latency_ms_mean"] is not None else None)
    return {"ood": ood, "control": control, "added_latency_ms": added,
            **({"accuracy": accuracy} if accuracy is not None else {}),
            "aborted_tier_bytes_to_client": ood["leaks"] + control["leaks"],
            "errors": sum(r["status"] != 200 for g in rows.values() for r in g),
            "requests": [_brief(group, r) for group, g in rows.items() for r in g]}


def _brief(group: str, r: dict[str, Any]) -> dict[str, Any]:
    """One request as the run record keeps it."""
    lat = r.get("latency_ms")
    return {"group": group, "request_id": r.get("request_id"), "status": r["status"],
            "tier": r.get("tier", ""), "escalated": r.get("escalated"),
            "latency_ms": None if lat is None else round(lat, 1), "leaked": leaked(r),
            "answer_head": r.get("answer_head", ""), **({"error": r["error"]} if "error" in r else {})}


def drill_passed(result: dict[str, Any], min_escalation_rate: float) -> bool:
    rate = result["ood"]["escalation_rate"]
    return (result["aborted_tier_bytes_to_client"] == 0 and result["errors"] == 0
            and rate is not None and rate >= min_escalation_rate)
