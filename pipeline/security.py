"""The ``security`` block of a deployment: how the curator side connects to the broker and to Redis.

Secrets are never written in the YAML: the configuration names where each comes from (``{env: VAR}``
or ``{file: path}``) and :meth:`SecretRef.reveal` reads it only when a client is built, as a
:class:`pydantic.SecretStr` (whose ``repr``/``str`` print ``**********``). Nothing here is part of the
privacy fingerprint (:mod:`pipeline.stream.state.fingerprint`): changing a credential changes no calibration.

::

    security:
      broker:                      # every Kafka client the project runs (pipeline.connections)
        tls: {ca_file: /etc/dpstream/tls/ca.crt, cert_file: ..., key_file: ...}   # cert/key optional
        sasl: {mechanism: SCRAM-SHA-512, username: {env: KAFKA_USER}, password: {file: /run/secrets/kafka}}
      redis:
        username: {env: REDIS_USER}      # an ACL user (a plain string is allowed: names are not secret)
        password: {env: REDIS_PASSWORD}
        tls: {ca_file: /etc/dpstream/tls/ca.crt}   # needs a rediss:// URL

Which protocol follows from what is set: neither = PLAINTEXT, tls = SSL, sasl = SASL_PLAINTEXT,
both = SASL_SSL. SASL PLAIN without TLS is refused (it sends the password in clear).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, SecretStr, field_validator, model_validator

__all__ = [
    "SecretRef",
    "SecretUnavailable",
    "TlsFiles",
    "SaslSettings",
    "BrokerSecurity",
    "RedisSecurity",
    "Security",
    "check_redis_url",
    "check_broker",
    "check_no_password_in_url",
    "redact_url",
]


class SecretUnavailable(ValueError):
    """A configured secret cannot be read (unset variable, missing or empty file); names the key, never a value."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


_INLINE = (
    "give where the secret comes from ({env: VARIABLE} or {file: /path}), never the value itself: "
    "a value in the YAML ends up in version control, in ConfigMaps and in error reports"
)


class SecretRef(_Strict):
    """Where a secret comes from: exactly one of an environment variable or a file (its content, stripped)."""

    env: str | None = None
    file: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _not_inline(cls, value: Any) -> Any:
        if isinstance(value, (str, bytes, int)):
            raise ValueError(_INLINE)
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError("set exactly one of env or file")
        if self.env is not None and not self.env:
            raise ValueError("env: empty variable name")
        return self

    def describe(self) -> str:
        return f"environment variable {self.env}" if self.env is not None else f"file {self.file}"

    def reveal(self, key: str) -> SecretStr:
        """The secret's value; :class:`SecretUnavailable` naming ``key`` and the source when it cannot be read."""
        if self.env is not None:
            value = os.environ.get(self.env)
            if not value:
                raise SecretUnavailable(
                    f"{key}: environment variable {self.env} is not set or empty"
                )
        else:
            assert self.file is not None  # _exactly_one: env or file
            try:
                value = Path(self.file).read_text().strip()
            except OSError as err:
                raise SecretUnavailable(
                    f"{key}: cannot read file {self.file} ({err.strerror})"
                ) from None
            if not value:
                raise SecretUnavailable(f"{key}: file {self.file} is empty")
        return SecretStr(value)


def _name(value: str | SecretRef, key: str) -> str:
    """A user name: given inline (names are not secret) or from a source like a secret."""
    return value if isinstance(value, str) else value.reveal(key).get_secret_value()


class TlsFiles(_Strict):
    """Server verification against ``ca_file``; a client certificate (``cert_file`` + ``key_file``) when
    the server asks for one. Paths are read when a client is built."""

    ca_file: str
    cert_file: str | None = None
    key_file: str | None = None
    key_password: SecretRef | None = None
    check_hostname: bool = True

    @model_validator(mode="after")
    def _pair(self) -> TlsFiles:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError(
                "cert_file and key_file are set together (the client certificate and its key)"
            )
        if self.key_password is not None and self.key_file is None:
            raise ValueError("key_password without key_file")
        return self


class SaslSettings(_Strict):
    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    username: str | SecretRef
    password: SecretRef

    @field_validator("username", mode="before")
    @classmethod
    def _username(cls, value: Any) -> Any:
        return value if isinstance(value, str) else SecretRef.model_validate(value)


class BrokerSecurity(_Strict):
    tls: TlsFiles | None = None
    sasl: SaslSettings | None = None

    @model_validator(mode="after")
    def _plain_in_clear(self) -> BrokerSecurity:
        if self.sasl is not None and self.sasl.mechanism == "PLAIN" and self.tls is None:
            raise ValueError(
                "sasl: mechanism PLAIN without tls sends the password in clear; add tls "
                "(or use SCRAM-SHA-256/512)"
            )
        return self

    @property
    def protocol(self) -> str:
        """Kafka's ``security_protocol`` for what is configured."""
        return {
            (False, False): "PLAINTEXT",
            (True, False): "SSL",
            (False, True): "SASL_PLAINTEXT",
            (True, True): "SASL_SSL",
        }[(self.tls is not None, self.sasl is not None)]

    @property
    def configured(self) -> bool:
        return self.tls is not None or self.sasl is not None


class RedisSecurity(_Strict):
    username: str | SecretRef | None = None
    password: SecretRef | None = None
    tls: TlsFiles | None = None

    @field_validator("username", mode="before")
    @classmethod
    def _username(cls, value: Any) -> Any:
        return value if value is None or isinstance(value, str) else SecretRef.model_validate(value)

    @model_validator(mode="after")
    def _user_needs_password(self) -> RedisSecurity:
        if self.username is not None and self.password is None:
            raise ValueError("username: an ACL user needs password")
        return self

    def credentials(self) -> tuple[str | None, SecretStr | None]:
        """(username, password), read from their sources now."""
        user = None if self.username is None else _name(self.username, "security.redis.username")
        password = (
            None if self.password is None else self.password.reveal("security.redis.password")
        )
        return user, password


class Security(_Strict):
    broker: BrokerSecurity = BrokerSecurity()
    redis: RedisSecurity = RedisSecurity()


def check_redis_url(url: str | None, security: Security) -> None:
    """Cross-checks of the ``redis`` URL with ``security.redis`` (raised as ValueError naming the key)."""
    from urllib.parse import urlsplit

    if url is None:
        if security.redis.tls is not None:
            raise ValueError(
                "security.redis.tls: the embedded Redis (no `redis` URL) speaks no TLS; it listens on "
                "loopback only. Set `redis: rediss://...` for a Redis with TLS"
            )
        return
    parts = urlsplit(url)
    check_no_password_in_url(url, "redis")
    if security.redis.tls is not None and parts.scheme != "rediss":
        raise ValueError(f"security.redis.tls: needs a rediss:// URL, got scheme {parts.scheme}://")


def check_no_password_in_url(url: str, key: str) -> None:
    """Refuse a Redis URL carrying a password (ValueError naming ``key``: ``redis``, ``DPSTREAM_REDIS``,
    ``--redis``): it would be printed with the URL, passed on job command lines visible in ``ps`` and stored in
    files. The message never contains the URL."""
    from urllib.parse import urlsplit

    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    if password:
        raise ValueError(
            f"{key}: the URL carries a password, which would be printed with the URL, shown in "
            "`ps` and stored in files; remove it and set security.redis.password: {env: VARIABLE} "
            "(or {file: path}) in the configuration"
        )


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for messages)."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
    except ValueError:
        return "<unparsable URL>"
    user = f"{parts.username}:***@" if parts.username else ":***@"
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit((parts.scheme, user + host, parts.path, parts.query, parts.fragment))


def check_broker(broker: str | None, security: Security) -> None:
    if broker is None and security.broker.configured:
        raise ValueError(
            "security.broker: the embedded broker (no `broker` set) supports neither TLS nor SASL; it "
            "listens on loopback only. Set `broker:` to a Kafka cluster with TLS/SASL listeners"
        )
