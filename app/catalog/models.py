"""Serving catalog: tiers (what a request can be served by), pools and replicas."""
from __future__ import annotations

from decimal import Decimal

from sqlalchemy import JSON, ForeignKey, Numeric, String, UniqueConstraint
from sqlalchemy.orm import Mapped, mapped_column, relationship

from app.extensions import db
from app.models_base import UTCDateTime, utcnow

UPSTREAM_KINDS = ("pool", "external")
ENGINES = ("vllm", "reference")
REPLICA_STATES = ("pending", "starting", "healthy", "draining", "down", "stopped")
Money = Numeric(18, 8)


class Tier(db.Model):
    __tablename__ = "tiers"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    rank: Mapped[int] = mapped_column(unique=True)  # 1 = cheapest
    model: Mapped[str] = mapped_column(String(200))
    price_input_per_m: Mapped[Decimal] = mapped_column(Money, default=0)
    price_cached_input_per_m: Mapped[Decimal] = mapped_column(Money, default=0)
    price_output_per_m: Mapped[Decimal] = mapped_column(Money, default=0)
    upstream_kind: Mapped[str] = mapped_column(String(16), default="pool")
    pool_id: Mapped[int | None] = mapped_column(ForeignKey("pools.id", ondelete="SET NULL"))
    endpoint_url: Mapped[str] = mapped_column(String(500), default="")
    # Name of the environment variable that holds the upstream key; never the key.
    api_key_env: Mapped[str] = mapped_column(String(100), default="")
    timeout_s: Mapped[float] = mapped_column(default=60.0)
    enabled: Mapped[bool] = mapped_column(default=True)
    created_at = mapped_column(UTCDateTime, default=utcnow)
    # S04's margin threshold calibrated for this tier's model (app.cascade.gamma); None:
    # the policy's margin_gamma applies
    margin_gamma: Mapped[float | None] = mapped_column(nullable=True)

    pool = relationship("Pool")

    def to_dict(self) -> dict:
        return {"id": self.id, "name": self.name, "rank": self.rank, "model": self.model,
                "price_input_per_m": str(self.price_input_per_m),
                "price_cached_input_per_m": str(self.price_cached_input_per_m),
                "price_output_per_m": str(self.price_output_per_m),
                "upstream_kind": self.upstream_kind, "pool_id": self.pool_id,
                "endpoint_url": self.endpoint_url, "api_key_env": self.api_key_env,
                "timeout_s": self.timeout_s, "enabled": self.enabled,
                "margin_gamma": self.margin_gamma}


class Pool(db.Model):
    __tablename__ = "pools"

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    node: Mapped[str] = mapped_column(String(64), default="local")
    engine: Mapped[str] = mapped_column(String(16), default="reference")
    model: Mapped[str] = mapped_column(String(200))
    served_model_name: Mapped[str] = mapped_column(String(200), default="")
    # Engine options (quantization, speculative config, LoRA, kv transfer ...).
    options: Mapped[dict] = mapped_column(JSON, default=dict)
    desired_replicas: Mapped[int] = mapped_column(default=1)
    base_port: Mapped[int] = mapped_column(default=8500)
    gpu_type: Mapped[str] = mapped_column(String(32), default="")
    gpus_per_replica: Mapped[int] = mapped_column(default=1)
    capacity_weight: Mapped[float] = mapped_column(default=1.0)
    created_at = mapped_column(UTCDateTime, default=utcnow)

    replicas = relationship("Replica", back_populates="pool", order_by="Replica.index",
                            cascade="all, delete-orphan")

    def to_dict(self) -> dict:
        return {"id": self.id, "name": self.name, "node": self.node, "engine": self.engine,
                "model": self.model, "served_model_name": self.served_model_name,
                "options": self.options, "desired_replicas": self.desired_replicas,
                "base_port": self.base_port, "gpu_type": self.gpu_type,
                "gpus_per_replica": self.gpus_per_replica,
                "capacity_weight": self.capacity_weight}


class Replica(db.Model):
    __tablename__ = "replicas"
    __table_args__ = (UniqueConstraint("pool_id", "index", name="uq_replicas_pool_index"),)

    id: Mapped[int] = mapped_column(primary_key=True)
    pool_id: Mapped[int] = mapped_column(ForeignKey("pools.id", ondelete="CASCADE"), index=True)
    index: Mapped[int] = mapped_column(default=0)
    url: Mapped[str] = mapped_column(String(300), default="")
    state: Mapped[str] = mapped_column(String(16), default="pending")
    pid: Mapped[int | None] = mapped_column(nullable=True)
    restarts: Mapped[int] = mapped_column(default=0)
    last_health_at = mapped_column(UTCDateTime, nullable=True)
    last_error: Mapped[str] = mapped_column(String(500), default="")
    weight: Mapped[float] = mapped_column(default=1.0)

    pool = relationship("Pool", back_populates="replicas")

    @property
    def name(self) -> str:
        return f"{self.pool.name}-{self.index}" if self.pool else f"replica-{self.id}"

    def to_dict(self) -> dict:
        return {"id": self.id, "pool_id": self.pool_id, "index": self.index, "url": self.url,
                "state": self.state, "pid": self.pid, "restarts": self.restarts,
                "weight": self.weight, "last_error": self.last_error,
                "last_health_at": self.last_health_at.isoformat() if self.last_health_at else None}


class ReplicaMetric(db.Model):
    """One scrape of a replica's /metrics (vLLM names), kept as a time series for the console.
    Counters are cumulative as the engine reports them; rates are differences of rows."""

    __tablename__ = "replica_metrics"

    id: Mapped[int] = mapped_column(primary_key=True)
    replica_id: Mapped[int] = mapped_column(ForeignKey("replicas.id", ondelete="CASCADE"),
                                            index=True)
    at = mapped_column(UTCDateTime, default=utcnow, index=True)
    prefix_cache_queries: Mapped[float] = mapped_column(default=0.0)
    prefix_cache_hits: Mapped[float] = mapped_column(default=0.0)
    kv_cache_usage_perc: Mapped[float] = mapped_column(default=0.0)
    num_requests_running: Mapped[float] = mapped_column(default=0.0)
    num_requests_waiting: Mapped[float] = mapped_column(default=0.0)
    ttft_seconds_sum: Mapped[float] = mapped_column(default=0.0)
    ttft_seconds_count: Mapped[float] = mapped_column(default=0.0)
    spec_decode_num_draft_tokens: Mapped[float] = mapped_column(default=0.0)
    spec_decode_num_accepted_tokens: Mapped[float] = mapped_column(default=0.0)
