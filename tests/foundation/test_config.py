import pytest

from config import ConfigError, load_config


def test_defaults_are_embedded():
    cfg = load_config("dev", environ={})
    assert cfg["SQLALCHEMY_DATABASE_URI"].startswith("sqlite:///")
    assert cfg["SQLALCHEMY_DATABASE_URI"].endswith("var/sluice.db")
    assert cfg["QDRANT_URL"] == "" and cfg["QDRANT_PATH"].endswith("var/qdrant")


def test_env_vars_are_read_when_called():
    cfg = load_config("dev", environ={"SLUICE_DATABASE_URL": "postgresql://x/y",
                                      "SLUICE_REDIS_URL": "redis://r:1/2",
                                      "SLUICE_QDRANT_URL": "http://q:6333"})
    assert cfg["SQLALCHEMY_DATABASE_URI"] == "postgresql://x/y"
    assert cfg["REDIS_URL"] == "redis://r:1/2"
    assert cfg["QDRANT_URL"] == "http://q:6333"


@pytest.mark.parametrize("secret", [None, "", "dev-insecure-key", "short"])
def test_prod_refuses_without_real_secret(secret):
    env = {} if secret is None else {"SLUICE_SECRET_KEY": secret}
    with pytest.raises(ConfigError):
        load_config("prod", environ=env)


def test_prod_accepts_real_secret():
    cfg = load_config("prod", environ={"SLUICE_SECRET_KEY": "x" * 40})
    assert cfg["SECRET_KEY"] == "x" * 40


def test_unknown_env_name_is_an_error():
    with pytest.raises(ConfigError):
        load_config("staging", environ={})


def test_without_a_key_each_instance_makes_its_own_once(tmp_path):
    """Security finding 4: the dev default was a public string anyone could sign an admin
    session cookie with."""
    import os
    from config import INSECURE_KEYS
    env = {"SLUICE_INSTANCE_DIR": str(tmp_path)}
    first = load_config("dev", environ=env)["SECRET_KEY"]
    assert first not in INSECURE_KEYS and len(first) >= 32
    assert load_config("dev", environ=env)["SECRET_KEY"] == first   # reused, sessions survive
    assert os.stat(tmp_path / "secret_key").st_mode & 0o777 == 0o600
    other = tmp_path / "other"
    assert load_config("dev", environ={"SLUICE_INSTANCE_DIR": str(other)})["SECRET_KEY"] != first
    with pytest.raises(ConfigError):
        load_config("prod", environ=env)   # prod never falls back to a made-up key
