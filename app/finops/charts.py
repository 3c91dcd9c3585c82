"""Plotly figure specs (plain dicts, rendered by the plotly.js the console serves)."""
from __future__ import annotations

from decimal import Decimal
from typing import Any

_LAYOUT = {"margin": {"l": 55, "r": 15, "t": 40, "b": 40}, "height": 300,
           "paper_bgcolor": "rgba(0,0,0,0)", "plot_bgcolor": "rgba(0,0,0,0)",
           "legend": {"orientation": "h", "y": -0.2}, "font": {"size": 12}}


def _f(v: Any) -> float | None:
    if v is None:
        return None
    return float(v) if isinstance(v, (Decimal, int, float)) else v


def _layout(title: str, **extra) -> dict:
    return {**_LAYOUT, "title": {"text": title, "x": 0.01}, **extra}


def dashboard_figures(data: dict[str, Any]) -> dict[str, dict]:
    t = data["timeline"]
    x = [r["bucket"].isoformat() for r in t]
    spend = {"data": [
        {"type": "scatter", "mode": "lines", "name": "Baseline (frontier)", "x": x,
         "y": [_f(r["baseline"]) for r in t], "line": {"dash": "dot", "color": "#9a3412"}},
        {"type": "scatter", "mode": "lines", "name": "Actual spend", "x": x,
         "y": [_f(r["cost"]) for r in t], "fill": "tozeroy", "line": {"color": "#0f766e"}}],
        "layout": _layout("Spend vs baseline (USD per " + data["grain"] + ")",
                          yaxis={"tickprefix": "$"})}
    mix = data["tier_mix"]
    tiers = {"data": [{"type": "pie", "hole": 0.45, "labels": [m["tier"] for m in mix],
                       "values": [m["requests"] for m in mix], "sort": False}],
             "layout": _layout("Tier mix (requests)")}
    cache = {"data": [
        {"type": "scatter", "mode": "lines", "name": "Prefix KV (tokens)", "x": x,
         "y": [r["prefix_hit_pct"] for r in t]},
        {"type": "scatter", "mode": "lines", "name": "Semantic", "x": x,
         "y": [r["semantic_hit_pct"] for r in t]},
        {"type": "scatter", "mode": "lines", "name": "Exact", "x": x,
         "y": [r["exact_hit_pct"] for r in t]}],
        "layout": _layout("Cache hit rates", yaxis={"ticksuffix": "%", "range": [0, 100]})}
    ttft = {"data": [
        {"type": "scatter", "mode": "lines", "name": "TTFT p50", "x": x,
         "y": [r["ttft_p50"] for r in t]},
        {"type": "scatter", "mode": "lines", "name": "TTFT p95", "x": x,
         "y": [r["ttft_p95"] for r in t]}],
        "layout": _layout("Time to first token", yaxis={"ticksuffix": " ms"})}
    unit = {"data": [
        {"type": "bar", "name": "Cost per 1k requests", "x": x,
         "y": [_f(r["cost_per_1k"]) for r in t], "marker": {"color": "#0f766e"}},
        {"type": "scatter", "mode": "lines", "name": "Output tokens / request", "x": x,
         "y": [r["output_per_request"] for r in t], "yaxis": "y2"}],
        "layout": _layout("Unit economics", yaxis={"tickprefix": "$"},
                          yaxis2={"overlaying": "y", "side": "right", "showgrid": False})}
    return {"spend": spend, "tiers": tiers, "cache": cache, "ttft": ttft, "unit": unit}


SHORT = {"structured_extraction": "JSON extraction", "support_rag": "Support RAG",
         "code_sql": "Code / SQL", "complex_reasoning": "Complex reasoning",
         "batch_summarization": "Batch summaries", "uncategorized": "Uncategorized"}


def cohort_figure(data: dict[str, Any]) -> dict:
    rows = data["rows"]
    labels = [SHORT.get(r["category"], r["category"]) for r in rows]
    return {"data": [
        {"type": "bar", "name": "Baseline", "x": labels, "y": [_f(r["baseline"]) for r in rows],
         "marker": {"color": "#fdba74"}},
        {"type": "bar", "name": "Actual", "x": labels, "y": [_f(r["cost"]) for r in rows],
         "marker": {"color": "#0f766e"}}],
        "layout": _layout("Baseline vs actual by cohort", barmode="group",
                          yaxis={"tickprefix": "$"})}
