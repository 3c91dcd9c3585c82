"""Frozen training datasets: a workflow's traces written once to
``ADAPTERS_DIR/datasets/<sha256>.jsonl`` and named by the hash of that file.

One JSON object per line, ordered by ``request_id``: ``{"request_id", "split": "train" |
"heldout", "messages", "response_format", "answer"}``, in the form tier 1 is served in
(``app.adapters.served_form``: S02's minified schema keys, with ``served_form`` saying
which aliases) when the training request gives one. The split is fixed by the
request id alone (``sha256(request_id)`` below ``heldout_fraction`` of the hash space is
held out), so a trace keeps its side when a later dataset of the same workflow grows.
Traces a validator failed are left out.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flask import current_app

from app.adapters.models import AdapterTrace, TrainingDataset
from app.adapters.traces import refresh_verdicts
from app.errors import NotFound, ValidationError
from app.extensions import db

TRAIN, HELDOUT = "train", "heldout"


def adapters_dir() -> Path:
    return Path(current_app.config["ADAPTERS_DIR"])


def split_of(request_id: str, heldout_fraction: float) -> str:
    bucket = int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:8], "big") / 2 ** 64
    return HELDOUT if bucket < heldout_fraction else TRAIN


def _line(trace: AdapterTrace, split: str, form: Callable[[dict], dict] | None = None
          ) -> bytes:
    record = {"request_id": trace.request_id, "split": split, "messages": trace.messages,
              "response_format": trace.response_format, "answer": trace.answer}
    if trace.max_tokens:
        record["max_tokens"] = trace.max_tokens
    return json.dumps(form(record) if form is not None else record, sort_keys=True,
                      ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


def _write_content_addressed(folder: Path, lines: list[bytes]) -> tuple[str, Path]:
    """Write to a temp file, hash it, rename it to ``<sha256>.jsonl``; a file already
    there (same content, by its name) is kept and the temp file removed."""
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".freeze-", suffix=".jsonl")
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as f:
            for line in lines:
                f.write(line)
                digest.update(line)
            f.flush()
            os.fsync(f.fileno())
        sha = digest.hexdigest()
        final = folder / f"{sha}.jsonl"
        if final.exists():
            os.unlink(tmp)
        else:
            os.link(tmp, final)   # fails, never overwrites, when another freeze won the race
            os.unlink(tmp)
        return sha, final
    except FileExistsError:
        os.unlink(tmp)
        return sha, folder / f"{sha}.jsonl"
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def freeze_dataset(tenant_id: int, workflow: str, *, min_traces: int,
                   heldout_fraction: float = 0.2, created_by: str = "system",
                   form: Callable[[dict], dict] | None = None) -> TrainingDataset:
    """Freeze the workflow's usable traces (in the open transaction; the caller commits),
    each record through ``form`` when given (``app.adapters.served_form``: the form tier 1
    is served in). The same traces in the same form freeze to the same file and row."""
    if not 0 < heldout_fraction < 1:
        raise ValidationError("bad held-out share",
                              {"heldout_fraction": ["must be between 0 and 1"]})
    refresh_verdicts(tenant_id, workflow)
    traces = list(db.session.scalars(db.select(AdapterTrace).where(
        AdapterTrace.tenant_id == tenant_id, AdapterTrace.workflow == workflow,
        db.or_(AdapterTrace.verdict.is_(None), AdapterTrace.verdict != "fail"))
        .order_by(AdapterTrace.request_id)))
    if len(traces) < min_traces:
        raise ValidationError(
            f"not enough traces to train on: {len(traces)} usable traces of this workflow, "
            f"{min_traces} needed (policy distill_min_traces)",
            {"workflow": [f"{len(traces)} of {min_traces} traces"]})
    splits = [split_of(t.request_id, heldout_fraction) for t in traces]
    if TRAIN not in splits or HELDOUT not in splits:
        raise ValidationError("the split left one side empty",
                              {"workflow": [f"{len(traces)} traces split into "
                                            f"{splits.count(TRAIN)} train and "
                                            f"{splits.count(HELDOUT)} held out"]})
    sha, path = _write_content_addressed(adapters_dir() / "datasets",
                                         [_line(t, s, form) for t, s in zip(traces, splits)])
    existing = db.session.scalar(db.select(TrainingDataset).where(TrainingDataset.sha256 == sha))
    if existing is not None:
        return existing
    ds = TrainingDataset(tenant_id=tenant_id, workflow=workflow, sha256=sha, path=str(path),
                         n_train=splits.count(TRAIN), n_heldout=splits.count(HELDOUT),
                         created_by=created_by)
    db.session.add(ds)
    db.session.flush()
    return ds


def read_dataset(dataset: TrainingDataset) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(train, held-out) records of a frozen dataset; NotFound when its file is gone,
    ValidationError when the file no longer hashes to its name."""
    path = Path(dataset.path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise NotFound(f"dataset file {path} is missing") from None
    if hashlib.sha256(data).hexdigest() != dataset.sha256:
        raise ValidationError(f"dataset file {path} changed since it was frozen")
    records = [json.loads(line) for line in data.splitlines() if line.strip()]
    return ([r for r in records if r["split"] == TRAIN],
            [r for r in records if r["split"] == HELDOUT])
