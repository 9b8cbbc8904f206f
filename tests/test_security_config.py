"""The ``security`` block: validation naming the key, secrets read from env/file only, the kwargs every
Kafka client gets, the TLS context built from configured files, and no secret in the fingerprint."""

from __future__ import annotations

import ssl

import pytest

from pipeline.config import ConfigError, parse_config
from pipeline.connections import SecretUnavailable, check_secrets, kafka_security, redis_client, tls_context
from pipeline.security import Security, TlsFiles
from pipeline.stream.state.fingerprint import fingerprint, privacy_config
from tls_helpers import make_pki

SECRET = "s3cr3t-value-never-printed"


def base(**extra) -> dict:
    cfg = {"name": "sec", "broker": "kafka:9093", "redis": "rediss://redis:6380/0", "roster": {"size": 10},
           "horizon": 4, "attributes": {"pov": {"type": "binary"}}, "budget": {"rho": 0.5},
           "releases": [{"name": "cu", "type": "cumulative", "attribute": "pov", "share": 1.0}]}
    cfg.update(extra)
    return cfg


def refused(cfg: dict) -> str:
    with pytest.raises(ConfigError) as err:
        parse_config(cfg)
    return str(err.value)


def test_inline_secrets_are_refused_naming_the_key():
    msg = refused(base(security={"redis": {"password": SECRET}}))
    assert "security.redis.password" in msg and "{env: VARIABLE}" in msg and SECRET not in msg
    msg = refused(base(security={"broker": {"sasl": {"mechanism": "SCRAM-SHA-512", "username": "w",
                                                     "password": SECRET}}}))
    assert "security.broker.sasl.password" in msg and SECRET not in msg


def test_password_in_the_redis_url_is_refused_without_echoing_it():
    msg = refused(base(redis=f"redis://worker:{SECRET}@redis:6379/0"))
    assert "redis: the URL carries a password" in msg and SECRET not in msg


@pytest.mark.parametrize("security, key", [
    ({"broker": {"sasl": {"mechanism": "PLAIN", "username": "w", "password": {"env": "X"}}}},
     "mechanism PLAIN without tls"),
    ({"broker": {"sasl": {"mechanism": "GSSAPI", "username": "w", "password": {"env": "X"}}}},
     "security.broker.sasl.mechanism"),
    ({"broker": {"tls": {"ca_file": "ca.crt", "cert_file": "c.crt"}}}, "cert_file and key_file are set together"),
    ({"redis": {"password": {"env": "X", "file": "/p"}}}, "security.redis.password: set exactly one of env or file"),
    ({"redis": {"username": "worker"}}, "an ACL user needs password"),
    ({"redis": {"tls": {}}}, "security.redis.tls.ca_file"),
    ({"broker": {"tsl": {}}}, "security.broker.tsl"),
])
def test_malformed_security_blocks_name_the_key(security, key):
    assert key in refused(base(security=security))


def test_tls_needs_rediss_and_a_configured_server():
    assert "needs a rediss:// URL" in refused(base(redis="redis://redis:6379/0",
                                                   security={"redis": {"tls": {"ca_file": "ca.crt"}}}))
    assert "embedded Redis" in refused(base(redis=None, security={"redis": {"tls": {"ca_file": "ca.crt"}}}))
    assert "embedded broker" in refused(base(broker=None, security={"broker": {"tls": {"ca_file": "ca.crt"}}}))


def test_protocol_follows_from_what_is_configured(monkeypatch):
    monkeypatch.setenv("KAFKA_PASSWORD", SECRET)
    sasl = {"mechanism": "SCRAM-SHA-256", "username": "worker", "password": {"env": "KAFKA_PASSWORD"}}
    assert kafka_security(Security()) == {"security_protocol": "PLAINTEXT"}
    kwargs = kafka_security(Security.model_validate({"broker": {"sasl": sasl}}))
    assert kwargs == {"security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-256",
                      "sasl_plain_username": "worker", "sasl_plain_password": SECRET}


def test_secrets_come_from_env_or_file_and_fail_naming_key_and_source(tmp_path, monkeypatch):
    secret_file = tmp_path / "redis-password"
    secret_file.write_text(SECRET + "\n")  # a trailing newline (echo, kubectl) is not part of the secret
    sec = Security.model_validate({"redis": {"username": {"env": "REDIS_USER"}, "password": {"file": str(secret_file)}}})
    monkeypatch.setenv("REDIS_USER", "releaser")
    user, password = sec.redis.credentials()
    assert (user, password.get_secret_value()) == ("releaser", SECRET)
    assert SECRET not in repr(password) and SECRET not in str(password) and SECRET not in repr(sec)

    monkeypatch.delenv("REDIS_USER")
    with pytest.raises(SecretUnavailable, match="security.redis.username: environment variable REDIS_USER is not set"):
        check_secrets(sec)
    gone = Security.model_validate({"redis": {"password": {"file": str(tmp_path / "missing")}}})
    with pytest.raises(SecretUnavailable, match=r"security.redis.password: cannot read file .*missing"):
        redis_client("redis://127.0.0.1:1/0", gone)


def test_tls_context_verifies_the_server_and_loads_the_client_certificate(tmp_path):
    pki = make_pki(tmp_path / "pki")
    ctx = tls_context(TlsFiles(ca_file=str(pki.ca), cert_file=str(pki.client_cert), key_file=str(pki.client_key)),
                      "security.broker.tls")
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    assert ctx.minimum_version >= ssl.TLSVersion.TLSv1_2
    assert [c["subject"] for c in ctx.get_ca_certs()] == [((("commonName", "dpstream test ca"),),)]
    assert not tls_context(TlsFiles(ca_file=str(pki.ca), check_hostname=False), "k").check_hostname
    with pytest.raises(SecretUnavailable, match="security.broker.tls.ca_file: cannot load"):
        tls_context(TlsFiles(ca_file=str(tmp_path / "nope.crt")), "security.broker.tls")
    with pytest.raises(SecretUnavailable, match="security.broker.tls.cert_file/key_file"):  # key of another cert
        tls_context(TlsFiles(ca_file=str(pki.ca), cert_file=str(pki.client_cert), key_file=str(pki.server_key)),
                    "security.broker.tls")
    kwargs = kafka_security(Security.model_validate({"broker": {"tls": {"ca_file": str(pki.ca)}}}))
    assert kwargs["security_protocol"] == "SSL" and isinstance(kwargs["ssl_context"], ssl.SSLContext)


def test_the_fingerprint_holds_no_security_setting(tmp_path):
    """Credentials change no calibration: rotating one must not look like a configuration change, and the
    privacy document (stored in Redis, shown by `status`) must not carry them."""
    plain = parse_config(base())
    secured = parse_config(base(security={
        "broker": {"tls": {"ca_file": "/etc/ca.crt"},
                   "sasl": {"mechanism": "SCRAM-SHA-512", "username": "worker-user", "password": {"env": "KPW"}}},
        "redis": {"username": "redis-user", "password": {"file": "/run/secrets/redis"}}}))
    ids = [f"u{i}" for i in range(10)]
    doc = privacy_config(secured, ids)
    assert fingerprint(doc) == fingerprint(privacy_config(plain, ids))
    text = repr(doc)
    for value in ("worker-user", "redis-user", "KPW", "/run/secrets/redis", "/etc/ca.crt"):
        assert value not in text
