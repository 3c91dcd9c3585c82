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
