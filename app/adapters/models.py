"""Adapters, their timeline, the traces they learn from and the datasets frozen from them."""
from __future__ import annotations

from sqlalchemy import JSON, ForeignKey, Integer, String, Text
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.extensions import db
from app.models_base import UTCDateTime, utcnow


class AdapterTrace(db.Model):
    """One answer a workflow's adapter may learn from: the request's messages and the
    answer the client got (scrubbed before it is written), with the validator's verdict
    when ``/v1/feedback`` gave one."""

    __tablename__ = "adapter_traces"

    id: Mapped[int] = mapped_column(primary_key=True)
    request_id: Mapped[str] = mapped_column(String(64), unique=True)
    tenant_id: Mapped[int] = mapped_column(index=True)
    workflow: Mapped[str] = mapped_column(String(64), index=True)
    at = mapped_column(UTCDateTime, default=utcnow, index=True)
    tier: Mapped[str] = mapped_column(String(64), default="")
    messages: Mapped[list] = mapped_column(JSON, default=list)
    response_format: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    answer: Mapped[str] = mapped_column(Text, default="")
    verdict: Mapped[str | None] = mapped_column(String(8), nullable=True)  # pass | fail
    # the client's output cap: the offline evaluation gives the adapter no more than the
    # live path would (an answer cut at max_tokens fails there too)
    max_tokens: Mapped[int | None] = mapped_column(Integer, nullable=True)


class TrainingDataset(db.Model):
    """A frozen, hashed snapshot of traces: the file at ``path`` never changes and its
    sha256 names it; train and held-out splits are fixed at freeze time."""

    __tablename__ = "adapter_datasets"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(index=True)
    workflow: Mapped[str] = mapped_column(String(64))
    sha256: Mapped[str] = mapped_column(String(64), unique=True)
    path: Mapped[str] = mapped_column(String(500))
    n_train: Mapped[int] = mapped_column(default=0)
    n_heldout: Mapped[int] = mapped_column(default=0)
    created_at = mapped_column(UTCDateTime, default=utcnow)
    created_by: Mapped[str] = mapped_column(String(255), default="system")


class Adapter(db.Model):
    """A LoRA adapter for one tenant workflow on a tier-1 pool, and where it is in its
    rollout (``app.adapters.states``). Its artifact is immutable and content-addressed."""

    __tablename__ = "adapters"

    id: Mapped[int] = mapped_column(primary_key=True)
    tenant_id: Mapped[int] = mapped_column(index=True)
    workflow: Mapped[str] = mapped_column(String(64), index=True)   # workflow signature
    workflow_name: Mapped[str] = mapped_column(String(200), default="")
    pool_id: Mapped[int | None] = mapped_column(ForeignKey("pools.id", ondelete="SET NULL"),
                                                nullable=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)   # the engine's lora_name
    base_model: Mapped[str] = mapped_column(String(200), default="")
    state: Mapped[str] = mapped_column(String(24), default="training", index=True)
    requested_by_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    requested_by: Mapped[str] = mapped_column(String(255), default="system")
    approved_by: Mapped[str | None] = mapped_column(String(255), nullable=True)
    dataset_id: Mapped[int | None] = mapped_column(
        ForeignKey("adapter_datasets.id", ondelete="SET NULL"), nullable=True)
    sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)
    artifact_path: Mapped[str | None] = mapped_column(String(500), nullable=True)
    manifest: Mapped[dict] = mapped_column(JSON, default=dict)
    hyperparams: Mapped[dict] = mapped_column(JSON, default=dict)
    progress: Mapped[dict] = mapped_column(JSON, default=dict)   # step, steps, loss, eta_s
    offline: Mapped[dict] = mapped_column(JSON, default=dict)    # held-out evaluation
    shadow: Mapped[dict] = mapped_column(JSON, default=dict)     # live shadow concordance
    live: Mapped[dict] = mapped_column(JSON, default=dict)       # canary watch (app.adapters.watch)
    canary_pct: Mapped[int] = mapped_column(default=0)
    previous_adapter_id: Mapped[int | None] = mapped_column(Integer, nullable=True)
    loaded: Mapped[dict] = mapped_column(JSON, default=dict)     # replica id -> ok | error
    # the policy's served-form fields when its dataset froze (app.adapters.served_form);
    # empty for an adapter from before they were kept: served as the policy says
    form: Mapped[dict] = mapped_column(JSON, default=dict)
    error: Mapped[str] = mapped_column(Text, default="")
    created_at = mapped_column(UTCDateTime, default=utcnow)
    updated_at = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)

    events = relationship("AdapterEvent", back_populates="adapter",
                          order_by="AdapterEvent.id", cascade="all, delete-orphan")
    dataset = relationship("TrainingDataset")

    def to_dict(self) -> dict:
        return {"id": self.id, "tenant_id": self.tenant_id, "workflow": self.workflow,
                "workflow_name": self.workflow_name, "pool_id": self.pool_id,
                "name": self.name, "base_model": self.base_model, "state": self.state,
                "requested_by": self.requested_by, "approved_by": self.approved_by,
                "dataset_id": self.dataset_id, "sha256": self.sha256,
                "manifest": self.manifest, "hyperparams": self.hyperparams,
                "progress": self.progress, "offline": self.offline, "shadow": self.shadow,
                "live": self.live,
                "canary_pct": self.canary_pct, "previous_adapter_id": self.previous_adapter_id,
                "loaded": self.loaded, "form": self.form, "error": self.error,
                "created_at": self.created_at.isoformat() if self.created_at else None}


class AdapterEvent(db.Model):
    """The rollout timeline: every transition, who made it, and why."""

    __tablename__ = "adapter_events"

    id: Mapped[int] = mapped_column(primary_key=True)
    adapter_id: Mapped[int] = mapped_column(ForeignKey("adapters.id", ondelete="CASCADE"),
                                            index=True)
    at = mapped_column(UTCDateTime, default=utcnow)
    actor_email: Mapped[str] = mapped_column(String(255), default="system")
    event: Mapped[str] = mapped_column(String(24))
    from_state: Mapped[str] = mapped_column(String(24))
    to_state: Mapped[str] = mapped_column(String(24))
    comment: Mapped[str] = mapped_column(Text, default="")
    data: Mapped[dict] = mapped_column(JSON, default=dict)

    adapter = relationship("Adapter", back_populates="events")

    def to_dict(self) -> dict:
        return {"at": self.at.isoformat() if self.at else None, "actor": self.actor_email,
                "event": self.event, "from": self.from_state, "to": self.to_state,
                "comment": self.comment, "data": self.data}
