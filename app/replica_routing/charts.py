"""Plotly figure of a simulator run (an HTML fragment; plotly.js is served by
``replica_routing.plotly_js``)."""
from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from app.headers import figure_html


def comparison_html(result: dict) -> str:
    pols = result.get("policies") or {}
    if not pols:
        return ""
    names = list(pols)
    fig = make_subplots(rows=1, cols=3, subplot_titles=(
        "prefix hit rate (token-weighted)", "max / mean load", "TTFT p50 / p99 (ms)"))
    colors = ["#2463eb" if n == "sluice" else "#9ca3af" if n == "oracle" else "#64748b"
              for n in names]
    fig.add_trace(go.Bar(x=names, y=[pols[n]["hit_rate"] for n in names], marker_color=colors,
                         name="hit rate", text=[f"{pols[n]['hit_rate']:.1%}" for n in names],
                         textposition="outside"), row=1, col=1)
    fig.add_trace(go.Bar(x=names, y=[pols[n]["max_over_mean_load"] for n in names],
                         marker_color=colors, name="max/mean load"), row=1, col=2)
    fig.add_hline(y=1.25, line_dash="dot", line_color="#c62828", row=1, col=2)
    fig.add_trace(go.Bar(x=names, y=[pols[n]["ttft_p50_ms"] for n in names], name="p50",
                         marker_color="#93c5fd"), row=1, col=3)
    fig.add_trace(go.Bar(x=names, y=[pols[n]["ttft_p99_ms"] for n in names], name="p99",
                         marker_color="#1e3a8a"), row=1, col=3)
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%", row=1, col=1)
    fig.update_yaxes(type="log", row=1, col=3)
    fig.update_layout(height=420, showlegend=False, barmode="group", template="plotly_white",
                      margin=dict(l=40, r=20, t=50, b=90))
    return figure_html(fig)
