"""Router benchmark: Sluice's calibrated router vs always-frontier, always-cheapest, a random
mix at the same tier shares, and a heuristic complexity router (LiteLLM-style).

How the labelled trace set is made (synthetic, stated model — not real LLM answers):
prompts are generated from templates for the seed's workload categories (structured
extraction, support RAG, code/SQL, batch summarisation, complex reasoning). Each prompt
has a latent difficulty d in [0, 1]: the generator turns d into visible structure (more
fields, distractors, conditions, multi-hop clauses, longer context) and the label model
adds hidden difficulty the text does not show: d_true = d + N(0, 0.08). Tier k "meets the
bar" with probability sigmoid((s_k − d_true) / 0.05), s = (0.45, 0.68, 0.97); one uniform
draw per prompt is shared by the tiers, so a stronger tier passes whenever a weaker one
does. Features are the real MiniLM embedding of the prompt (app.contract.cache.embedding) plus
app.core.router_features; training uses app.cascade.training exactly as the service does.
Costs: (prompt + completion tokens) x $0.06 / $0.35 / $3.50 per 1M.

Splits: 60% train (classifiers; isotonic maps on their out-of-fold scores, as the service
does), 20% calibration (τ for the quality target, and the heuristic's thresholds, are
chosen here), 20% test (every reported figure). "Before calibration" is a plain
(unweighted) logistic regression on the same features, without any calibration map.

Production labels (issue 24): the sections above train on every tier's label, which the
ledger never has. The last section gives train and calibration rows only the labels the
gateway would produce (app.cascade.evaluation.tier_labels on the trace): each request is
served frontier-first (1/3) or by tier 2 before any router exists (2/3), the client's
feedback (the served tier's true label) comes back for 80% of them, and tier-1
exploration answers explore_pct of them again on tier 1 off the path. Exploration's
verdict model: tier 1 agrees with the served answer when both are right (two wrong
answers are taken to differ). τ is then chosen on the calibration rows as a promotion
does (app.cascade.regret: 95% bound on regret <= router_max_regret 0.008 at the quality
target); every figure is measured on test with all labels known.

    .venv/bin/python bench/router.py [--n 3000] [--seed 0] [--explore 0 5 20 100]
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from app.core import router_model as rm  # noqa: E402
from app.core.router_features import request_features  # noqa: E402
from app.cascade.training import fit_router, uncalibrated  # noqa: E402

PRICES = np.array([0.06, 0.35, 3.50]) / 1e6
SKILL = np.array([0.45, 0.68, 0.97])
CATEGORIES = {  # share of traffic, Beta(a, b) of difficulty, completion tokens
    "structured_extraction": (0.45, (1.6, 5.0), 60),
    "support_rag": (0.20, (2.0, 3.5), 180),
    "code_sql": (0.12, (2.2, 2.5), 220),
    "batch_summarization": (0.10, (1.8, 4.0), 150),
    "complex_reasoning": (0.13, (5.0, 2.0), 400),
}
NAMES = ["Acme GmbH", "Northwind", "Bluepeak SA", "Kestrel Labs", "Vela Systems", "Tamarind BV",
         "Maria Keller", "Tom Okafor", "Priya Nair", "Jonas Berg", "Lyon", "Porto", "Graz"]
FIELDS = ["invoice number", "total amount", "due date", "supplier name", "VAT id", "currency",
          "billing city", "line items", "payment terms", "purchase order", "IBAN", "discount"]
TWISTS = ["if the amount is not in EUR, convert it at the rate stated in the footer",
          "ignore the cancelled invoice that the text also mentions",
          "when two dates appear, use the later one unless it is a delivery date",
          "the supplier may be named only through its parent company; resolve it",
          "return null for any field that is only implied, and explain why in a notes field",
          "line items are split across two pages and one is a credit note; net them"]
HOPS = ["then determine which clause governs", "and explain why the exception applies",
        "compare the two policies and reconcile the conflict", "given that the second contract "
        "supersedes the first only for EU customers", "and derive the effective date step by step",
        "assuming the guarantor defaults first", "evaluate whether the limitation cap still holds",
        "and justify the answer with the relevant precedent"]
SQL_EASY = ["Write a SQL query that counts the rows in the {t} table.",
            "SELECT the ten newest {t} records ordered by created_at."]
SQL_HARD = ["use a recursive CTE over the {t} hierarchy", "add a window function for a running "
            "total per customer", "JOIN against the archived {t} partitions and deduplicate",
            "make it run in under 100 ms on 2 billion rows; explain the index choice",
            "handle NULL currencies and late-arriving facts"]
TABLES = ["orders", "invoices", "customers", "shipments", "tickets"]


def _pick(rng, pool, k):
    return [pool[i] for i in rng.choice(len(pool), size=min(k, len(pool)), replace=False)]


def make_prompt(cat: str, d: float, rng: np.random.Generator) -> tuple[str, bool]:
    """(prompt text, schema present) for a category and visible difficulty d."""
    k = int(np.clip(round(d * 5 + rng.normal(0, 0.7)), 0, 6))
    names = " and ".join(_pick(rng, NAMES, 1 + k // 2))
    if cat == "structured_extraction":
        fields = ", ".join(_pick(rng, FIELDS, 1 + k))
        text = f"Extract the {fields} from this document from {names}: invoice INV-{rng.integers(1000, 99999)}" \
               f", total {rng.integers(10, 9999)} EUR."
        if k >= 2:
            text += " Note: " + "; ".join(_pick(rng, TWISTS, k - 1)) + "."
        return text, True
    if cat == "support_rag":
        text = f"A customer of {names} asks how to reset their password."
        if k >= 1:
            text = (f"A customer of {names} asks whether their plan allows exporting audit logs "
                    f"in the EU region. Context: {k + 1} policy excerpts follow. ")
            text += " ".join(f"Excerpt {i + 1}: {h}." for i, h in enumerate(_pick(rng, HOPS, k)))
        return text, rng.random() < 0.3
    if cat == "code_sql":
        t = str(rng.choice(TABLES))
        text = str(rng.choice(SQL_EASY)).format(t=t)
        if k >= 1:
            text += " Also " + "; ".join(h.format(t=t) for h in _pick(rng, SQL_HARD, k)) + "."
        return text, False
    if cat == "batch_summarization":
        text = f"Summarize in one sentence the weekly report of {names}."
        if k >= 2:
            text = (f"Summarize the {k + 1} attached quarterly reports of {names} and "
                    + "; ".join(_pick(rng, HOPS, k - 1)) + ".")
        return text, rng.random() < 0.5
    text = f"Question about {names}: which obligation applies?"
    text += " " + "; ".join(_pick(rng, HOPS, max(1, k))) + "."
    return text, rng.random() < 0.2


def build(n: int, seed: int):
    rng = np.random.default_rng(seed)
    cats = list(CATEGORIES)
    shares = np.array([CATEGORIES[c][0] for c in cats])
    rows = []
    for i in range(n):
        cat = cats[rng.choice(len(cats), p=shares / shares.sum())]
        _, (a, b), out_tokens = CATEGORIES[cat]
        d = float(rng.beta(a, b))
        text, schema = make_prompt(cat, d, rng)
        d_true = d + rng.normal(0, 0.08)
        p = 1 / (1 + np.exp(-(SKILL - d_true) / 0.05))
        u = rng.random()
        labels = (u < p).astype(int)
        tokens = int(len(text.split()) * 1.3) + 250 + int(rng.integers(0, 200))  # + system prompt
        cost = (tokens + out_tokens) * PRICES
        rows.append({"cat": cat, "text": text, "schema": schema, "labels": labels, "cost": cost,
                     "workflow": f"{cat}-{i % 3}"})
    return rows


def heuristic_scores(texts: list[str]) -> np.ndarray:
    """LiteLLM-style complexity score: weighted rule dimensions, no learning."""
    code = re.compile(r"\b(sql|select|join|cte|function|index|query)\b", re.I)
    reason = re.compile(r"\b(explain|why|compare|derive|step by step|justify|evaluate|reconcile"
                        r"|assuming|given that)\b", re.I)
    simple = re.compile(r"\b(one sentence|reset|count|what is)\b", re.I)
    out = []
    for t in texts:
        words = len(t.split())
        s = (0.35 * min(words / 80, 1.0) + 0.25 * min(len(code.findall(t)) / 3, 1.0)
             + 0.3 * min(len(reason.findall(t)) / 3, 1.0) + 0.1 * ("?" in t)
             - 0.2 * bool(simple.search(t)))
        out.append(s)
    return np.array(out)


def heuristic_curve(scores, labels, costs):
    grid = np.quantile(scores, np.linspace(0, 1, 41))
    pts = []
    for lo in grid:
        for hi in grid[grid >= lo]:
            chosen = np.where(scores < lo, 1, np.where(scores < hi, 2, 3))
            pt = rm.operating_point(chosen, labels, costs)
            pt["taus"] = {"lo": float(lo), "hi": float(hi)}
            pts.append(pt)
    return pts


def fmt(pt) -> str:
    if pt is None:
        return "  (no point reaches the target)"
    sh = pt["shares"]
    return (f"quality {pt['relative_quality']:7.2%}  cost {pt['cost_fraction']:7.2%} of frontier"
            f"  shares T1 {sh[1]:5.1%} T2 {sh[2]:5.1%} T3 {sh[3]:5.1%}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", type=float, default=0.99)
    ap.add_argument("--emb-cache", help="an .npy file to keep the embeddings in between runs")
    ap.add_argument("--max-regret", type=float, nargs="*", default=[0.008, 0.02],
                    help="router_max_regret values of the production-labels section")
    ap.add_argument("--explore", type=float, nargs="*", default=[0, 5, 20, 100],
                    help="explore_pct values of the production-labels section")
    ap.add_argument("--raw-dims", type=int, default=-1,
                    help="leading feature columns left unscaled (default: the embedding)")
    args = ap.parse_args()
    rows = build(args.n, args.seed)
    from app.contract.cache.embedding import embed_many
    cache = Path(args.emb_cache) if args.emb_cache else None
    t0 = time.perf_counter()
    if cache is not None and cache.exists():
        emb = np.load(cache)
        t_emb = float("nan")
    else:
        emb = embed_many([r["text"] for r in rows])
        t_emb = (time.perf_counter() - t0) / len(rows)
        if cache is not None:
            np.save(cache, emb)
    X = np.stack([request_features(e, [{"role": "user", "content": r["text"]}],
                                   schema_present=r["schema"], workflow=r["workflow"])
                  for e, r in zip(emb, rows)])
    L = np.stack([r["labels"] for r in rows])
    C = np.stack([r["cost"] for r in rows])
    idx = np.random.default_rng(args.seed + 1).permutation(len(rows))
    a, b = int(0.6 * len(rows)), int(0.8 * len(rows))
    tr, ca, te = idx[:a], idx[a:b], idx[b:]
    t0 = time.perf_counter()
    raw = emb.shape[1] if args.raw_dims < 0 else args.raw_dims
    per_tier = {1: (X[tr], L[tr, 0]), 2: (X[tr], L[tr, 1])}
    params = fit_router(per_tier, fallback_rank=3, raw_dims=raw)
    t_fit = time.perf_counter() - t0
    # "before calibration": a plain (unweighted) logistic regression on the same features
    plain = rm.load(fit_router(per_tier, fallback_rank=3, raw_dims=raw, calibration="none",
                               balanced=False))
    router = rm.load(params)
    Xc, Lc, Cc = X[ca], L[ca], C[ca]
    Xt, Lt, Ct = X[te], L[te], C[te]
    Qc, Q = rm.predict_batch(router, Xc), rm.predict_batch(router, Xt)
    Q0 = rm.predict_batch(plain, Xt)
    Qb = rm.predict_batch(rm.load(uncalibrated(params)), Xt)
    taus = {1: 0.8, 2: 0.7}
    n_time = 2000
    t0 = time.perf_counter()
    for i in range(n_time):
        rm.route(router, Xt[i % len(Xt)], taus)
    t_route = (time.perf_counter() - t0) / n_time

    print("\n\n".join(__doc__.split("\n\n")[1:4]) + "\n")
    print(f"traces: {len(rows)}: train {len(tr)} (classifiers + isotonic maps on out-of-fold "
          f"scores), calibration {len(ca)} (tau chosen here), test {len(te)} (every figure "
          "below)")
    print("pass rates on test: " + ", ".join(f"T{k + 1} {Lt[:, k].mean():.1%}" for k in range(3)))
    print(f"embedding {t_emb * 1e3:.2f} ms/request (batched MiniLM, CPU); route() "
          f"{t_route * 1e6:.1f} us/request beyond it; training {t_fit:.1f} s\n")
    print("calibration on test (ECE, 10 bins):")
    for j, rank in enumerate(router.ranks):
        print(f"  tier {rank}: plain logistic regression {rm.ece(Q0[:, j], Lt[:, j]):.4f}  "
              f"Sluice (class-balanced + isotonic) {rm.ece(Q[:, j], Lt[:, j]):.4f}  "
              f"[class-balanced, no isotonic {rm.ece(Qb[:, j], Lt[:, j]):.4f}]")

    curve = rm.cost_quality_curve(Q, router.ranks, Lt, Ct)
    front = rm.pareto(curve)
    print("\nSluice router cost-quality curve on test (Pareto points over the tau grid):")
    for p in front[:: max(1, len(front) // 12)] + [front[-1]]:
        print(f"  tau1 {p['taus']['1']:.2f} tau2 {p['taus']['2']:.2f}  {fmt(p)}")
    cal_pick = rm.choose_taus(rm.cost_quality_curve(Qc, router.ranks, Lc, Cc), args.target)
    chosen = None
    if cal_pick:
        ct = {int(k): v for k, v in cal_pick["taus"].items()}
        chosen = {**rm.operating_point(rm.route_batch(Q, router.ranks, ct, 3), Lt, Ct),
                  "taus": cal_pick["taus"]}
    hindsight = rm.choose_taus(curve, args.target)
    at_policy = rm.operating_point(rm.route_batch(Q, router.ranks, taus, 3), Lt, Ct)
    n = len(te)
    always = {k: rm.operating_point(np.full(n, k), Lt, Ct) for k in (1, 3)}
    h_cal = heuristic_scores([rows[i]["text"] for i in ca])
    h_test = heuristic_scores([rows[i]["text"] for i in te])
    h_pick = rm.choose_taus(heuristic_curve(h_cal, Lc, Cc), args.target)
    hchosen = None
    if h_pick:
        lo, hi = h_pick["taus"]["lo"], h_pick["taus"]["hi"]
        hchosen = rm.operating_point(np.where(h_test < lo, 1, np.where(h_test < hi, 2, 3)), Lt, Ct)
    print(f"\nTarget >= {args.target:.0%} of frontier quality; thresholds chosen on the "
          "calibration split, figures on test:")
    print(f"  always-frontier             {fmt(always[3])}")
    print(f"  always-cheapest             {fmt(always[1])}")
    print(f"  Sluice router               {fmt(chosen)}")
    if chosen:
        print(f"      tau1 {chosen['taus']['1']:.2f} tau2 {chosen['taus']['2']:.2f}")
        rs = np.random.default_rng(7)
        pts = [rm.operating_point(rs.choice([1, 2, 3], size=n, p=[chosen["shares"][k] for k in (1, 2, 3)]),
                                  Lt, Ct) for _ in range(20)]
        q = np.mean([p["relative_quality"] for p in pts])
        c = np.mean([p["cost_fraction"] for p in pts])
        print(f"  random mix, same shares     quality {q:7.2%}  cost {c:7.2%} of frontier (mean of 20)")
    print(f"  heuristic complexity router {fmt(hchosen)}")
    print(f"  Sluice at policy defaults tau=(0.80, 0.70): {fmt(at_policy)}")
    print(f"  (hindsight: cheapest test-curve point at the target {fmt(hindsight)})")
    if chosen:
        print(f"\ncost reduction vs always-frontier (taus from calibration, measured on test): "
              f"Sluice {1 - chosen['cost_fraction']:.1%} at {chosen['relative_quality']:.2%} "
              "relative quality"
              + (f"; heuristic {1 - hchosen['cost_fraction']:.1%} at "
                 f"{hchosen['relative_quality']:.2%}" if hchosen else "; heuristic n/a"))
    best_h = max(heuristic_curve(h_test, Lt, Ct),
                 key=lambda p: p["relative_quality"] - 1e-9 * p["cost"])
    print(f"heuristic router's best test quality anywhere on its grid: {fmt(best_h)}")
    production_labels(args, X, L, C, tr, ca, te, raw)
    return 0


def served_labels(L: np.ndarray, explore_pct: float, rng: np.random.Generator) -> np.ndarray:
    """The labels the ledger would hold for these rows (NaN unknown), by the service's rule."""
    from app.cascade.evaluation import tier_labels
    out = np.full(L.shape, np.nan)
    for i, truth in enumerate(L):
        served = 3 if rng.random() < 1 / 3 else 2
        trace = {"tier_rank": served}
        if rng.random() < 0.8:
            trace["feedback"] = "pass" if truth[served - 1] else "fail"
        if rng.random() * 100 < explore_pct:
            trace["shadow"] = {"1": bool(truth[0] and truth[served - 1])}
        out[i] = [np.nan if v is None else v for v in tier_labels(trace)]
    return out


def true_regret(chosen: np.ndarray, L: np.ndarray) -> float:
    """Share of requests sent to a cheaper tier that fails where the frontier passes."""
    rows = np.arange(len(chosen))
    return float(((L[rows, chosen - 1] == 0) & (L[:, -1] == 1) & (chosen < L.shape[1])).mean())


def production_labels(args, X, L, C, tr, ca, te, raw) -> None:
    from app.cascade import regret
    print(f"\nProduction labels (issue 24): tau from the regret bound (95%, >= {args.target:.0%} "
          "quality) on calibration rows, figures on test:")
    print("  labels                      tier-1 labels (+)  bound  tau1  tau2   test figures"
          "                                                     test regret")
    Xt, Lt, Ct = X[te], L[te], C[te]
    regimes = [("all labels known (oracle)", None)] + [(f"explore_pct {p:g}", p)
                                                      for p in args.explore]
    for name, pct in regimes:
        rng = np.random.default_rng(args.seed + 5)
        Ltr = L[tr].astype(float) if pct is None else served_labels(L[tr], pct, rng)
        Lca = L[ca].astype(float) if pct is None else served_labels(L[ca], pct, rng)
        per_tier = {}
        for rank in (1, 2):
            known = ~np.isnan(Ltr[:, rank - 1])
            per_tier[rank] = (X[tr][known], Ltr[known, rank - 1].astype(int))
        params = fit_router(per_tier, fallback_rank=3, raw_dims=raw)
        Qt = rm.predict_batch(rm.load(params), Xt)
        y1 = per_tier[1][1]
        for bound in args.max_regret:
            found = regret.choose(params, X[ca], Lca, C[ca], quality_target=args.target,
                                  max_regret=bound, confidence=0.95)
            head = f"  {name:27s} {len(y1):6d} ({int(y1.sum()):5d})  {bound:5.1%}  "
            if found["point"] is None:
                print(head + f"not promoted: {found['reason']}")
                continue
            taus = {int(k): v for k, v in found["point"]["taus"].items()}
            chosen = rm.route_batch(Qt, (1, 2), taus, 3)
            pt = rm.operating_point(chosen, Lt, Ct)
            print(head + f"{taus[1]:.2f}  {taus[2]:.2f}   {fmt(pt)}  "
                  f"{true_regret(chosen, Lt):.2%}")


if __name__ == "__main__":
    sys.exit(main())
