"""An adapter's rollout as an explicit table: event -> (states it may leave, state it
enters, permission needed). Nothing else changes ``Adapter.state``.

    training --trained--> candidate --shadow--> shadow --submit--> awaiting_approval
    training --fail/cancel--> failed/cancelled            candidate --submit--> awaiting_approval
    awaiting_approval --approve--> canary --advance--> canary (next step) --promote--> promoted
    awaiting_approval --reject--> rejected
    canary/promoted --rollback--> rolled_back              (restores the previous adapter)
    candidate/shadow/rejected/rolled_back/failed/cancelled --retire--> retired
    promoted --supersede--> retired (a newer one was promoted) --restore--> promoted (it was
    rolled back)

``None`` as the permission: the system's own step (the training task, the shadow
evaluator), not a person's.
"""
from __future__ import annotations

from app.errors import Conflict

TRAINING, CANDIDATE, SHADOW, AWAITING = "training", "candidate", "shadow", "awaiting_approval"
CANARY, PROMOTED, ROLLED_BACK, REJECTED = "canary", "promoted", "rolled_back", "rejected"
FAILED, CANCELLED, RETIRED = "failed", "cancelled", "retired"

TRANSITIONS: dict[str, tuple[frozenset[str], str, str | None]] = {
    "trained": (frozenset({TRAINING}), CANDIDATE, None),
    "fail": (frozenset({TRAINING}), FAILED, None),
    "cancel": (frozenset({TRAINING}), CANCELLED, "adapter.train"),
    "shadow": (frozenset({CANDIDATE}), SHADOW, "adapter.train"),
    "submit": (frozenset({CANDIDATE, SHADOW}), AWAITING, "adapter.train"),
    "approve": (frozenset({AWAITING}), CANARY, "adapter.approve"),
    "reject": (frozenset({AWAITING}), REJECTED, "adapter.approve"),
    "advance": (frozenset({CANARY}), CANARY, "adapter.approve"),
    "promote": (frozenset({CANARY}), PROMOTED, "adapter.approve"),
    "rollback": (frozenset({CANARY, PROMOTED}), ROLLED_BACK, "adapter.rollback"),
    "retire": (frozenset({CANDIDATE, SHADOW, REJECTED, ROLLED_BACK, FAILED, CANCELLED}),
               RETIRED, "adapter.train"),
    # the system's side of a promotion or a rollback: the adapter a new one replaced
    "supersede": (frozenset({PROMOTED}), RETIRED, None),
    "restore": (frozenset({RETIRED}), PROMOTED, None),
}
# States whose adapter serves live traffic (the gateway snapshot carries them).
SERVING = frozenset({CANARY, PROMOTED})
# States whose adapter the pool's engines hold loaded (serving, or answering shadow runs).
HELD = SERVING | {SHADOW}
# A workflow has at most one adapter in these at a time.
IN_FLIGHT = frozenset({TRAINING, CANDIDATE, SHADOW, AWAITING, CANARY})
# An adapter nobody serves and nothing trains: "retrain" (app.adapters.training.retrain)
# trains a new one of its workflow on the traces there are now, retiring it.
RETRAINABLE = frozenset({CANDIDATE, SHADOW, REJECTED, ROLLED_BACK, FAILED, CANCELLED, RETIRED})
# Canary steps: share of the workflow's traffic (consistent per session / prefix).
CANARY_STEPS = (5, 25, 100)


def target(event: str, state: str) -> str:
    """The state ``event`` leads to from ``state``; Conflict when the table forbids it."""
    if event not in TRANSITIONS:
        raise Conflict(f"unknown adapter event {event!r}")
    allowed, to, _ = TRANSITIONS[event]
    if state not in allowed:
        raise Conflict(f"cannot {event} an adapter that is {state.replace('_', ' ')}")
    return to


def permission(event: str) -> str | None:
    return TRANSITIONS[event][2]


def events_from(state: str) -> list[str]:
    """Events the table allows from ``state`` (what the console may offer)."""
    return [e for e, (allowed, _, perm) in TRANSITIONS.items() if state in allowed and perm]
