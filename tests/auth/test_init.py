"""``flask --app wsgi sluice init``: first admin and the seeded three-tier catalog."""
import re

from app.audit.models import AuditLog
from app.auth.models import User
from app.catalog.models import Tier
from app.extensions import db
from tests.console.web import login

EMAIL, GOOD = "root@example.com", "Sluice-Admin-2026!"


def _init(runner, password):
    return runner.invoke(args=["sluice", "init"],
                         env={"SLUICE_ADMIN_EMAIL": EMAIL, "SLUICE_ADMIN_PASSWORD": password})


def test_init_refuses_a_weak_password(runner, app):
    result = _init(runner, "password")
    assert result.exit_code != 0
    assert "password: must be at least 10 characters" in result.output
    assert db.session.scalar(db.select(User)) is None


def test_init_creates_admin_and_tiers_then_admin_sees_them(runner, app, client):
    result = _init(runner, GOOD)
    assert result.exit_code == 0, result.output
    assert "created tier tier-1" in result.output
    admin = db.session.scalar(db.select(User))
    assert (admin.email, admin.role, admin.tenant_id) == (EMAIL, "admin", None)
    assert [t.name for t in db.session.scalars(db.select(Tier).order_by(Tier.rank))] == [
        "tier-1", "tier-2", "tier-3"]
    seeded = sorted((a.action, a.actor_email) for a in db.session.scalars(
        db.select(AuditLog).where(AuditLog.action.in_(
            ["tier.create", "pool.create", "policy.create"]))))
    assert seeded == sorted([("tier.create", "system")] * 3 + [("pool.create", "system")] * 2
                            + [("policy.create", "system")])
    # the seeded engines publish KV events, each pool on ports of its own
    from app.catalog.models import Pool
    from workers.pools.vllm_cmd import node_ports
    pools = db.session.scalars(db.select(Pool).order_by(Pool.name)).all()
    ports = [node_ports(p.to_dict()) for p in pools]
    assert all(p.options.get("kv_events") for p in pools) and len(ports) == 2
    assert not set(ports[0]) & set(ports[1]) and len(ports[0]) == len(ports[1]) == 3
    again = _init(runner, GOOD)
    assert again.exit_code == 0 and "an admin already exists" in again.output
    assert db.session.scalar(db.select(db.func.count(Tier.id))) == 3

    login(client, EMAIL, GOOD)
    html = client.get("/catalog/tiers").get_data(as_text=True)
    rows = re.findall(r"<tr>\s*<td>(\d)</td><td>(tier-\d)</td>.*?"
                      r'<td class="blended"><strong>([^<]+)</strong>', html, re.S)
    assert rows == [("1", "tier-1", "$0.06"), ("2", "tier-2", "$0.35"),
                    ("3", "tier-3", "$3.50")]
    assert "SLUICE_PROVIDER_KEY_FRONTIER" in html
