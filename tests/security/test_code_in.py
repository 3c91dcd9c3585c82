"""Security finding 3, "code in": pool ``options.env`` and ``options.extra_args`` went
verbatim into the engine's environment and argv (LD_PRELOAD, PYTHONWARNINGS + BROWSER,
--worker-extension-cls ... run code on every GPU node). Options are typed now: known
settings with types and ranges, an allowlist of variables, engine flags from a list that
loads no code, and extra arguments only from an admin, audited."""
from __future__ import annotations

import pytest

from app.audit.models import AuditLog
from app.catalog import service
from app.catalog.models import Pool
from app.errors import Forbidden, ValidationError
from app.extensions import db
from tests.console.web import browser, login, submit
from tests.factories import UserFactory
from workers.pools.vllm_cmd import build_command, validate_options

ATTACKS = [
    ("vllm", {"env": {"LD_PRELOAD": "/tmp/evil.so"}}),
    ("vllm", {"env": {"PYTHONWARNINGS": "ignore::0:antigravity.x:0", "BROWSER": "sh -c id"}}),
    ("vllm", {"env": {"PYTHONPATH": "/tmp/evil"}}),
    ("vllm", {"extra_args": ["--worker-extension-cls", "evil.Ext"]}),
    ("vllm", {"extra_args": ["--trust-remote-code"]}),
    ("vllm", {"extra_args": ["--chat-template", "/tmp/evil.jinja"]}),
    ("vllm", {"extra_args": ["--seed=1;rm -rf /"]}),
    ("vllm", {"speculative": {"method": "eagle3", "model": "m", "num_speculative_tokens": 3,
                              "trust_remote_code": True}}),
    ("vllm", {"lora": {"modules": {"a": "/x; curl evil"}}}),
    ("vllm", {"no_such_option": 1}),
    ("reference", {"extra_args": ["--port", "1"]}),
]


@pytest.mark.parametrize("engine,options", ATTACKS)
def test_code_loading_options_never_reach_an_engine(engine, options):
    assert validate_options(options, engine)
    pool = {"name": "p", "engine": engine, "model": "m", "options": options}
    with pytest.raises(ValueError):
        build_command(pool, 0)   # the node refuses too, whatever SQL holds


@pytest.mark.parametrize("engine,options", ATTACKS)
def test_the_console_refuses_them_even_for_an_admin(app, engine, options):
    admin = UserFactory(role="admin")
    with pytest.raises(ValidationError) as exc:
        service.save_pool(admin, {"name": "evil-pool", "engine": engine, "model": "m",
                                  "options": options})
    assert exc.value.errors["options"]
    assert db.session.scalar(db.select(Pool).where(Pool.name == "evil-pool")) is None


def test_supported_settings_still_build():
    options = {"env": {"NCCL_DEBUG": "INFO", "VLLM_ATTENTION_BACKEND": "FLASHINFER"},
               "extra_args": ["--enforce-eager", "--max-num-batched-tokens", "8192",
                              "--dtype=bfloat16"]}
    argv, env = build_command({"name": "p", "engine": "vllm", "model": "m", "options": options},
                              0)
    assert argv[-4:] == ["--enforce-eager", "--max-num-batched-tokens", "8192",
                         "--dtype=bfloat16"]
    assert env["NCCL_DEBUG"] == "INFO"


def test_extra_args_are_admin_only_and_audited(app):
    ops, admin = UserFactory(role="ops"), UserFactory(role="admin")
    data = {"name": "tuned", "engine": "vllm", "model": "m",
            "options": {"extra_args": ["--enforce-eager"]}}
    with pytest.raises(Forbidden):
        service.save_pool(ops, data)
    pool = service.save_pool(admin, data)
    # ops may still change everything else, as long as extra_args stays as the admin set it
    service.save_pool(ops, {**data, "options": {**data["options"], "max_num_seqs": 64}},
                      pool.id)
    with pytest.raises(Forbidden):
        service.save_pool(ops, {**data, "options": {"extra_args": []}}, pool.id)
    (audit,) = db.session.scalars(db.select(AuditLog).where(
        AuditLog.action == "pool.extra_args_change", AuditLog.entity_id == str(pool.id)))
    assert audit.after == {"extra_args": ["--enforce-eager"]} and audit.actor_id == admin.id


def test_the_pool_form_shows_why(app):
    client = browser(app)
    login(client, UserFactory(role="admin").email)
    resp = submit(client, "/catalog/pools/new", {
        "name": "evil", "node": "local", "engine": "vllm", "model": "m",
        "options": '{"env": {"LD_PRELOAD": "/tmp/x.so"}}', "desired_replicas": "0",
        "base_port": "8600", "gpus_per_replica": "0", "capacity_weight": "1"})
    assert resp.status_code == 422
    assert "may not set LD_PRELOAD" in resp.get_data(as_text=True)
