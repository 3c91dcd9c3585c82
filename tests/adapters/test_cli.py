"""``flask adapters ...``: listing, training and the rollout steps as a named console user,
with the same rules as the console (role, four eyes, comments) and clear errors."""
from __future__ import annotations

import json

from tests.adapters.conftest import TRAIN_WORKFLOW, reload
from tests.factories import UserFactory


def _cli(app, *args):
    return app.test_cli_runner().invoke(args=["adapters", *map(str, args)])


def test_list_as_text_and_json_with_a_state_filter(app, make_adapter, two_tenants):
    acme, globex = two_tenants
    canary = make_adapter(acme, "canary", canary_pct=25, offline={"concordance": 0.912})
    training = make_adapter(globex, "training")
    out = _cli(app, "list")
    assert out.exit_code == 0
    lines = out.output.splitlines()
    assert canary.name in lines[1] and "canary" in lines[1] and "25%" in lines[1] \
        and "91.2%" in lines[1]
    assert training.name in lines[0] and "training" in lines[0]
    rows = json.loads(_cli(app, "list", "--json", "--state", "canary").output)
    assert [(r["id"], r["canary_pct"]) for r in rows] == [(canary.id, 25)]
    assert _cli(app, "list", "--state", "promoted").output.strip() == "no adapters"
    bad = _cli(app, "list", "--state", "live")
    assert bad.exit_code == 1 and "unknown state" in bad.output


def test_rollout_from_approval_to_promotion_and_back(app, make_adapter, two_tenants):
    acme = two_tenants[0]
    old = make_adapter(acme, "promoted", workflow="wf-orders")
    new = make_adapter(acme, "awaiting_approval", workflow="wf-orders")
    approver = UserFactory(role="approver")
    ops = UserFactory(role="ops")
    steps = [("approve", approver, "is now canary at 5%"),
             ("advance", approver, "is now canary at 25%"),
             ("promote", approver, "is now promoted"),
             ("rollback", ops, "is now rolled_back")]
    for event, user, said in steps:
        out = _cli(app, event, new.id, "--comment", f"cli {event}", "--as", user.email.upper())
        assert out.exit_code == 0 and said in out.output, (event, out.output)
    assert reload(new.id).state == "rolled_back"
    assert reload(old.id).state == "promoted"   # superseded at promote, restored at rollback
    assert [(e.event, e.actor_email, e.comment) for e in reload(new.id).events][:2] == [
        ("approve", approver.email, "cli approve"), ("advance", approver.email, "cli advance")]


def test_the_cli_keeps_the_rules(app, make_adapter, two_tenants):
    requester = UserFactory(role="admin")
    adapter = make_adapter(two_tenants[0], "awaiting_approval", requester=requester)
    own = _cli(app, "approve", adapter.id, "--comment", "mine", "--as", requester.email)
    assert own.exit_code == 1 and "four eyes" in own.output
    viewer = UserFactory(role="viewer")
    out = _cli(app, "approve", adapter.id, "--comment", "x", "--as", viewer.email)
    assert out.exit_code == 1 and "may not approve" in out.output
    approver = UserFactory(role="approver")
    out = _cli(app, "reject", adapter.id, "--as", approver.email)
    assert out.exit_code == 1 and "comment: a rejection needs a comment" in out.output
    out = _cli(app, "approve", adapter.id, "--comment", "x", "--as", "nobody@example.com")
    assert out.exit_code == 1 and "no active console user with email 'nobody@example.com'" \
        in out.output
    out = _cli(app, "approve", 999999, "--comment", "x", "--as", approver.email)
    assert out.exit_code == 1 and "no such adapter" in out.output
    assert _cli(app, "approve", adapter.id, "--comment", "x").exit_code == 2   # --as needed
    assert reload(adapter.id).state == "awaiting_approval"
    out = _cli(app, "reject", adapter.id, "--comment", "too few samples", "--as", approver.email)
    assert out.exit_code == 0 and reload(adapter.id).state == "rejected"


def test_train_queues_a_training_for_the_named_user(app, trainable):
    tenant, sent = trainable
    ops = UserFactory(role="ops")
    out = _cli(app, "train", "--tenant", tenant.id, "--workflow", "Invoices", "--as", ops.email,
               "--hyperparams", '{"rank": 8, "max_steps": 5}')
    assert out.exit_code == 0 and "queued for training: 5 steps" in out.output, out.output
    adapter_id = sent[0][1][0]
    adapter = reload(adapter_id)
    assert (adapter.state, adapter.workflow, adapter.requested_by, adapter.hyperparams["rank"]) \
        == ("training", TRAIN_WORKFLOW, ops.email, 8)
    busy = _cli(app, "train", "--tenant", tenant.id, "--workflow", TRAIN_WORKFLOW,
                "--as", ops.email)
    assert busy.exit_code == 1 and "finish, cancel or retire it first" in busy.output
    bad = _cli(app, "train", "--tenant", tenant.id, "--workflow", "x", "--as", ops.email,
               "--hyperparams", "{rank")
    assert bad.exit_code == 2 and "--hyperparams" in bad.output
    unknown = _cli(app, "train", "--tenant", tenant.id, "--workflow", "nope", "--as", ops.email)
    assert unknown.exit_code == 1 and "has no workflow 'nope'" in unknown.output
    approver = UserFactory(role="approver")
    refused = _cli(app, "train", "--tenant", tenant.id, "--workflow", "x",
                   "--as", approver.email)
    assert refused.exit_code == 1 and "may not train" in refused.output
    assert len(sent) == 1


def test_retrain_from_the_cli(app, trainable):
    from app.adapters.models import AdapterTrace
    from app.extensions import db
    tenant, sent = trainable
    ops = UserFactory(role="ops")
    _cli(app, "train", "--tenant", tenant.id, "--workflow", "Invoices", "--as", ops.email,
         "--hyperparams", '{"rank": 8, "max_steps": 5}')
    held = reload(sent[0][1][0])
    held.state = "shadow"
    db.session.commit()
    same = _cli(app, "retrain", held.id, "--as", ops.email)
    assert same.exit_code == 1 and "no new traces" in same.output
    db.session.add(AdapterTrace(request_id=f"req_cli_{tenant.id}", tenant_id=tenant.id,
                                workflow=TRAIN_WORKFLOW, tier="tier-3", answer='{"invoice": 99}',
                                messages=[{"role": "user", "content": "invoice 99"}]))
    db.session.commit()
    out = _cli(app, "retrain", held.id, "--as", ops.email, "--comment", "one more trace")
    assert out.exit_code == 0, out.output
    new_id = [args[0] for name, args in sent if name == "adapters.train"][-1]
    assert f"adapter {held.id} retired; adapter {new_id} (" in out.output
    assert "queued for training on the current traces: 5 steps" in out.output
    assert reload(held.id).state == "retired" and reload(new_id).state == "training"
