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


_BUCKET_MS = {"hour": 3_600_000, "day": 86_400_000, "month": 30 * 86_400_000}
_EMPTY = ("No traffic in this period yet. Requests through the gateway appear here within "
          "one rollup (a few minutes; Refresh figures now on the Overview runs it at once).")


def _timeline_layout(title: str, data: dict[str, Any], **extra) -> dict:
    """A time axis over the whole period (one bucket alone stays a dated point, not an
    axis ticked in fractions of a millisecond), and a note instead of a blank plot."""
    period = data.get("period")
    xaxis = {"type": "date"}
    if period is not None:
        xaxis["range"] = [period.start.isoformat(), period.end.isoformat()]
    layout = _layout(title, xaxis=xaxis, **extra)
    if not data["timeline"]:
        layout["annotations"] = [{"text": _EMPTY, "showarrow": False, "xref": "paper",
                                  "yref": "paper", "x": 0.5, "y": 0.5,
                                  "font": {"color": "#6b7280", "size": 11}}]
    return layout


def dashboard_figures(data: dict[str, Any]) -> dict[str, dict]:
    """Spend as bars per bucket (a day with traffic is a bar, however few days there are),
    rates and latencies as lines with markers (a single bucket still shows)."""
    t = data["timeline"]
    x = [r["bucket"].isoformat() for r in t]
    lm = "lines+markers"
    # a bar is its bucket wide (Plotly would size a lone bar from the gap to its neighbours)
    width = [_BUCKET_MS.get(data["grain"], _BUCKET_MS["day"]) * 0.8] * len(x)
    spend = {"data": [
        {"type": "bar", "name": "Actual spend", "x": x, "y": [_f(r["cost"]) for r in t],
         "width": width, "offset": 0, "marker": {"color": "#0f766e"}},
        {"type": "scatter", "mode": lm, "name": "Baseline (frontier)", "x": x,
         "y": [_f(r["baseline"]) for r in t], "line": {"dash": "dot", "color": "#9a3412"}}],
        "layout": _timeline_layout("Spend vs baseline (USD per " + data["grain"] + ")", data,
                                   yaxis={"tickprefix": "$", "rangemode": "tozero"})}
    mix = data["tier_mix"]
    tiers = {"data": [{"type": "pie", "hole": 0.45, "labels": [m["tier"] for m in mix],
                       "values": [m["requests"] for m in mix], "sort": False}],
             "layout": _layout("Tier mix (requests)")}
    cache = {"data": [
        {"type": "scatter", "mode": lm, "name": "Prefix KV (tokens)", "x": x,
         "y": [r["prefix_hit_pct"] for r in t]},
        {"type": "scatter", "mode": lm, "name": "Semantic", "x": x,
         "y": [r["semantic_hit_pct"] for r in t]},
        {"type": "scatter", "mode": lm, "name": "Exact", "x": x,
         "y": [r["exact_hit_pct"] for r in t]}],
        "layout": _timeline_layout("Cache hit rates", data,
                                   yaxis={"ticksuffix": "%", "range": [0, 100]})}
    ttft = {"data": [
        {"type": "scatter", "mode": lm, "name": "TTFT p50", "x": x,
         "y": [r["ttft_p50"] for r in t]},
        {"type": "scatter", "mode": lm, "name": "TTFT p95", "x": x,
         "y": [r["ttft_p95"] for r in t]}],
        "layout": _timeline_layout("Time to first token", data,
                                   yaxis={"ticksuffix": " ms", "rangemode": "tozero"})}
    unit = {"data": [
        {"type": "bar", "name": "Cost per 1k requests", "x": x,
         "y": [_f(r["cost_per_1k"]) for r in t], "width": width, "offset": 0,
         "marker": {"color": "#0f766e"}},
        {"type": "scatter", "mode": lm, "name": "Output tokens / request", "x": x,
         "y": [r["output_per_request"] for r in t], "yaxis": "y2"}],
        "layout": _timeline_layout("Unit economics", data, yaxis={"tickprefix": "$"},
                                   yaxis2={"overlaying": "y", "side": "right",
                                           "showgrid": False})}
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


def stage_figure(data: dict[str, Any]) -> dict:
    """From the frontier baseline down to the actual spend, one step per stage (a
    waterfall of the shown amounts: the steps end exactly at the shown actual)."""
    lines = [ln for ln in data["lines"] if ln["amount_shown"] or ln["stage"] in
             ("cache", "routing", "minify", "prefix", "escalation")]
    return {"data": [{
        "type": "waterfall", "orientation": "v",
        "measure": ["absolute", *["relative"] * len(lines), "total"],
        "x": ["Frontier baseline", *[ln["label"] for ln in lines], "Actual"],
        "y": [_f(data["baseline_shown"]), *[-_f(ln["amount_shown"]) for ln in lines],
              _f(data["cost_shown"])],
        "decreasing": {"marker": {"color": "#0f766e"}},
        "increasing": {"marker": {"color": "#b91c1c"}},
        "totals": {"marker": {"color": "#9a3412"}}, "connector": {"line": {"color": "#9ca3af"}}}],
        "layout": _layout("Savings per stage: baseline to actual", showlegend=False,
                          yaxis={"tickprefix": "$"}, height=340)}


def months_figure(data: dict[str, Any]) -> dict:
    months = data["months"]
    x = [m["month"] for m in months]
    return {"data": [
        {"type": "bar", "name": "Actual spend", "x": x, "y": [_f(m["cost"]) for m in months],
         "marker": {"color": "#0f766e"}},
        {"type": "scatter", "mode": "lines+markers", "name": "Baseline (frontier)", "x": x,
         "y": [_f(m["baseline"]) for m in months], "line": {"dash": "dot", "color": "#9a3412"}}],
        "layout": _layout("Twelve months: actual spend vs baseline", yaxis={"tickprefix": "$"},
                          xaxis={"type": "category"})}
