"""Every broker and Redis client of a process is built from one place, with the deployment's ``security``.

A process states its deployment once (:func:`use_security`: the command line when it loads the
configuration, :class:`pipeline.stream.process.runtime.Runtime` in the jobs); each construction site then
adds :func:`kafka_security` to its Kafka client's arguments (aiokafka and kafka-python take the same
names: ``security_protocol``, ``ssl_context``, ``sasl_mechanism``, ``sasl_plain_username``,
``sasl_plain_password``) and builds Redis clients with :func:`redis_client`. The default, before any
deployment is stated, is plaintext without credentials: the embedded services on loopback.

Secrets are read from their sources each time a client is built (a rotated file is picked up by the
next client) and never logged; :func:`connection_failure` turns a refused login or a failed TLS
handshake into one line naming the configuration key, without the secret.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path
from typing import Any

from pipeline.security import SecretUnavailable, Security, TlsFiles
from pipeline.stream.local.broker_tls import BROKER_TLS_ENV, BrokerTls

__all__ = [
    "use_security",
    "active_security",
    "kafka_security",
    "embedded_broker_tls",
    "redis_client",
    "tls_context",
    "connection_failure",
    "check_secrets",
    "SecretUnavailable",
]

_active: list[Security] = [Security()]


def use_security(security: Security) -> None:
    """The settings every client built afterwards in this process uses (a deployment's ``security``)."""
    _active[0] = security


def active_security() -> Security:
    return _active[0]


def tls_context(tls: TlsFiles, key: str) -> ssl.SSLContext:
    """A client context verifying the server against ``tls.ca_file`` (hostname checked unless
    ``check_hostname: false``), presenting the client certificate when configured. TLS 1.2 at least."""
    try:
        context = ssl.create_default_context(cafile=tls.ca_file)
    except (OSError, ssl.SSLError) as err:
        raise SecretUnavailable(
            f"{key}.ca_file: cannot load {tls.ca_file} ({_reason(err)})"
        ) from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = tls.check_hostname
    if tls.cert_file is not None:
        password = (
            tls.key_password.reveal(f"{key}.key_password").get_secret_value()
            if tls.key_password
            else None
        )
        try:
            context.load_cert_chain(tls.cert_file, tls.key_file, password=password)
        except (OSError, ssl.SSLError) as err:
            raise SecretUnavailable(
                f"{key}.cert_file/key_file: cannot load {tls.cert_file} with {tls.key_file} "
                f"({_reason(err)})"
            ) from None
    return context


def _reason(err: Exception) -> str:
    return getattr(err, "reason", None) or getattr(err, "strerror", None) or type(err).__name__


def kafka_security(security: Security | None = None) -> dict[str, Any]:
    """Keyword arguments for any aiokafka or kafka-python client (consumer, producer, admin). Without
    ``security.broker``, the embedded broker's gate when this process tree runs one (mutual TLS with the
    certificate ``dpstream up`` generated: :mod:`pipeline.stream.local.broker_tls`)."""
    broker = (security or active_security()).broker
    if not broker.configured:
        gate = embedded_broker_tls()
        if gate is not None:
            return {"security_protocol": "SSL", "ssl_context": tls_context(gate, BROKER_TLS_ENV)}
    kwargs: dict[str, Any] = {"security_protocol": broker.protocol}
    if broker.tls is not None:
        kwargs["ssl_context"] = tls_context(broker.tls, "security.broker.tls")
    if broker.sasl is not None:
        sasl = broker.sasl
        kwargs["sasl_mechanism"] = sasl.mechanism
        kwargs["sasl_plain_username"] = (
            sasl.username
            if isinstance(sasl.username, str)
            else sasl.username.reveal("security.broker.sasl.username").get_secret_value()
        )
        kwargs["sasl_plain_password"] = sasl.password.reveal(
            "security.broker.sasl.password"
        ).get_secret_value()
    return kwargs


def check_broker_listener(bootstrap: str) -> None:
    """Refuse at once, in one line (:class:`pipeline.stream.kafka.listener_check.ListenerMismatch`),
    a broker that speaks TLS to this process's plain Kafka clients, or plain Kafka to its TLS
    ones."""
    from pipeline.stream.kafka.listener_check import check_listener

    check_listener(bootstrap, kafka_security().get("security_protocol", "PLAINTEXT"))


def embedded_broker_tls() -> TlsFiles | None:
    """The client files of the embedded broker's gate named by ``DPSTREAM_BROKER_TLS``, if any."""
    directory = os.environ.get(BROKER_TLS_ENV)
    if not directory:
        return None
    files = BrokerTls(Path(directory))
    return TlsFiles(
        ca_file=str(files.ca_file), cert_file=str(files.client_cert), key_file=str(files.client_key)
    )


def redis_client(
    url: str, security: Security | None = None, client_class: Any = None, **options: Any
):
    """A ``client_class`` (``redis.Redis`` unless given, e.g. ``redis.asyncio.Redis`` inside the jobs'
    event loops) for ``url`` with the configured ACL user, password and TLS files; ``options`` are passed
    on (timeouts, retries)."""
    import redis

    settings = (security or active_security()).redis
    user, password = settings.credentials()
    if user is not None:
        options["username"] = user
    if password is not None:
        options["password"] = password.get_secret_value()
    elif (
        user is None
    ):  # no login configured: the embedded Redis's generated password, if it is this one
        from urllib.parse import urlsplit

        from pipeline.stream.local.embedded import local_redis_password

        parts = urlsplit(url)
        generated = local_redis_password(parts.hostname, parts.port)
        if generated is not None:
            options["password"] = generated
    if settings.tls is not None:
        tls = settings.tls
        tls_context(
            tls, "security.redis.tls"
        )  # fails early, with the key, if a file cannot be loaded
        options.update(
            ssl_ca_certs=tls.ca_file,
            ssl_check_hostname=tls.check_hostname,
            ssl_min_version=ssl.TLSVersion.TLSv1_2,
        )
        if tls.cert_file is not None:
            options.update(ssl_certfile=tls.cert_file, ssl_keyfile=tls.key_file)
            if tls.key_password is not None:
                options["ssl_password"] = tls.key_password.reveal(
                    "security.redis.tls.key_password"
                ).get_secret_value()
    return (client_class or redis.Redis).from_url(url, **options)


def check_secrets(security: Security | None = None) -> None:
    """Read every configured secret and load every TLS file now (:class:`SecretUnavailable` naming the key), so
    that a command fails at once instead of inside a client's retry loop."""
    security = security or active_security()
    kafka_security(security)
    security.redis.credentials()
    if security.redis.tls is not None:
        tls_context(security.redis.tls, "security.redis.tls")


def connection_failure(err: BaseException) -> str | None:
    """One line for a refused login, a TLS failure or an unreadable secret (naming the configuration key,
    never the secret); None for anything else."""
    import redis

    if isinstance(err, SecretUnavailable):
        return f"cannot read a configured secret: {err}"
    from pipeline.stream.kafka.listener_check import ListenerMismatch

    if isinstance(err, ListenerMismatch):
        return str(err)
    if isinstance(err, redis.AuthenticationError) or (
        isinstance(err, redis.ResponseError) and str(err).startswith(("WRONGPASS", "NOAUTH"))
    ):
        return (
            f"Redis refused the login ({_first_line(err)}); check security.redis.username/password "
            "and the ACL user on the server"
        )
    if isinstance(err, redis.exceptions.NoPermissionError):
        return f"Redis refused a command to this user ({_first_line(err)}); check its ACL (docs/security.md)"
    if (
        isinstance(err, redis.ConnectionError)
        and "SSL" in str(err)
        or isinstance(err, ssl.SSLError)
    ):
        return f"TLS handshake failed ({_first_line(err)}); check the tls block in security (ca_file, certificates)"
    kafka_auth = _kafka_auth_errors()
    if kafka_auth and isinstance(err, kafka_auth):
        if "Authorization" in type(err).__name__:
            return (
                f"the broker's ACLs refused this user ({type(err).__name__}: {_first_line(err)}); "
                "see docs/security.md for what each role needs"
            )
        return (
            f"the broker refused the login ({type(err).__name__}: {_first_line(err)}); check "
            "security.broker.sasl (mechanism, username, password) and the broker's users"
        )
    return None


def _kafka_auth_errors() -> tuple[type, ...]:
    from kafka import errors as kerr

    found = [
        getattr(kerr, n)
        for n in (
            "SaslAuthenticationFailedError",
            "AuthenticationFailedError",
            "IllegalSaslStateError",
            "UnsupportedSaslMechanismError",
            "TopicAuthorizationFailedError",
            "GroupAuthorizationFailedError",
            "ClusterAuthorizationFailedError",
        )
        if hasattr(kerr, n)
    ]
    try:
        from aiokafka import errors as aerr

        found += [
            getattr(aerr, n)
            for n in (
                "SaslAuthenticationFailedError",
                "AuthenticationFailedError",
                "TopicAuthorizationFailedError",
                "GroupAuthorizationFailedError",
            )
            if hasattr(aerr, n)
        ]
    except ImportError:  # pragma: no cover
        pass
    return tuple(found)


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
