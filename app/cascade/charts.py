"""Plotly figures of a router version's held-out metrics (HTML fragments; plotly.js is served
once by ``cascade.plotly_js``)."""
from __future__ import annotations

import plotly.graph_objects as go

from app.cascade.models import RouterModel
from app.headers import figure_html

_LAYOUT = dict(height=360, margin=dict(l=50, r=20, t=40, b=50), template="plotly_white")


def _html(fig: go.Figure) -> str:
    return figure_html(fig)


def reliability_html(model: RouterModel) -> str:
    cal = (model.metrics or {}).get("calibration") or {}
    if not cal:
        return ""
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", name="perfect",
                             line=dict(dash="dot", color="#999")))
    for rank, rep in sorted(cal.items()):
        for key, label, dash in (("reliability_before", "raw", "dash"),
                                 ("reliability", "calibrated", "solid")):
            pts = [b for b in rep.get(key, []) if b["count"]]
            ece = rep["ece_before" if key == "reliability_before" else "ece_after"]
            fig.add_trace(go.Scatter(
                x=[b["mean_q"] for b in pts], y=[b["pass_rate"] for b in pts],
                mode="lines+markers", line=dict(dash=dash),
                name=f"tier {rank} {label} (ECE {ece:.3f})",
                text=[f"n={b['count']}" for b in pts]))
    fig.update_layout(title="Reliability (held-out)", xaxis_title="predicted q",
                      yaxis_title="observed pass rate", **_LAYOUT)
    return _html(fig)


def curve_html(model: RouterModel) -> str:
    held = (model.metrics or {}).get("held_out") or {}
    curve = held.get("curve") or []
    if not curve:
        return ""
    fig = go.Figure()
    fig.add_trace(go.Scatter(
        x=[p["cost_fraction"] for p in curve], y=[p["relative_quality"] for p in curve],
        mode="lines+markers", name="router (τ grid, Pareto)",
        text=[f"τ1={p['taus']['1']} τ2={p['taus']['2']}" for p in curve]))
    fig.add_trace(go.Scatter(x=[1.0], y=[1.0], mode="markers", name="always frontier",
                             marker=dict(symbol="star", size=12)))
    chosen = held.get("chosen")
    if chosen:
        fig.add_trace(go.Scatter(x=[chosen["cost_fraction"]], y=[chosen["relative_quality"]],
                                 mode="markers", name="chosen for target",
                                 marker=dict(symbol="diamond", size=12)))
    fig.update_layout(title="Cost vs quality (held-out, relative to always-frontier)",
                      xaxis_title="cost / frontier cost", yaxis_title="quality / frontier quality",
                      **_LAYOUT)
    return _html(fig)


def gamma_curve_html(fit: dict) -> str:
    """γ calibration (issue 24): escalation rate, recall and precision of the margin
    monitor as γ varies on the labelled traces, the fitted γ marked."""
    curve = fit.get("curve") or []
    if not curve:
        return ""
    x = [p["gamma"] for p in curve]
    fig = go.Figure()
    for key, name in (("recall", "recall (wrong answers escalated)"),
                      ("precision", "precision (escalated that were wrong)"),
                      ("escalation_rate", "escalation rate")):
        fig.add_trace(go.Scatter(x=x, y=[p[key] for p in curve], mode="lines", name=name,
                                 line=dict(shape="hv")))
    if fit.get("gamma") is not None:
        fig.add_vline(x=fit["gamma"], line_dash="dash", line_color="#b91c1c",
                      annotation_text=f"γ = {fit['gamma']:.4f}")
    if fit.get("gamma_before") is not None:
        fig.add_vline(x=fit["gamma_before"], line_dash="dot", line_color="#6b7280",
                      annotation_text="in force", annotation_position="bottom right")
    fig.update_layout(title=f"Margin monitor on {fit['n']} labelled traces of {fit['tier']}",
                      xaxis_title="γ (escalate when the mean margin is below it)",
                      yaxis=dict(range=[0, 1.02], tickformat=".0%"), **_LAYOUT)
    return _html(fig)
