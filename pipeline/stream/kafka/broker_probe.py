"""One bounded Kafka exchange with the bootstrap broker, before an admin client is built.

kafka-python's bootstrap bounds connecting and retrying, not a TLS handshake: a TLS client against a
plain broker (which reads the ClientHello as the size of a ~370 MB request and waits for the rest)
waits forever, whatever ``bootstrap_timeout_ms`` says. :func:`probe_broker` sends the first request
every Kafka client sends (ApiVersions v0, answered before any SASL login) over a socket with a
timeout, in the protocol the clients are configured for, and retries until its bound: a broker that
is still starting is waited for; one that speaks the other protocol ends in
:class:`~pipeline.stream.kafka.log_identity.BrokerUnreachable` with one line saying so.
"""

from __future__ import annotations

import socket
import ssl
import struct
import time

from pipeline.connections import active_security, kafka_security
from pipeline.stream.kafka.log_identity import BrokerUnreachable
from pipeline.stream.local.broker_tls import BROKER_TLS_ENV

__all__ = ["probe_broker"]

_API_VERSIONS, _VERSION_0 = 18, 0
_CORRELATION = 0x64707362  # any id: the answer must echo it
_CLIENT_ID = b"dpstream-probe"
_ATTEMPT_SECONDS = 5.0  # one attempt's socket timeout (connect, handshake, answer)


def _request() -> bytes:
    body = struct.pack(">hhih", _API_VERSIONS, _VERSION_0, _CORRELATION, len(_CLIENT_ID))
    body += _CLIENT_ID
    return struct.pack(">i", len(body)) + body


def _receive(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionResetError("the broker closed the connection")
        data += chunk
    return data


def _tls_setting() -> str:
    """The setting that made the clients speak TLS."""
    return "security.broker" if active_security().broker.configured else BROKER_TLS_ENV


class _Failed(Exception):
    def __init__(self, stage: str, err: BaseException):
        super().__init__(stage, err)
        self.stage, self.err = stage, err  # stage: "connect", "handshake" or "answer"


def _exchange(host: str, port: int, context: ssl.SSLContext | None, timeout: float) -> None:
    """One ApiVersions request and the head of its answer, or _Failed."""
    stage = "connect"
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            stage = "handshake"
            sock = raw if context is None else context.wrap_socket(raw, server_hostname=host)
            stage = "answer"
            with sock:
                sock.sendall(_request())
                size, correlation = struct.unpack(">ii", _receive(sock, 8))
    except OSError as err:
        raise _Failed(stage, err) from err
    if correlation != _CORRELATION or not 4 <= size < 1 << 20:
        raise _Failed(stage, ValueError("it answered something other than a Kafka response"))


def _diagnosis(failed: _Failed, tls: bool) -> str:
    """What one failed attempt says about the broker, in a few words."""
    stage, err = failed.stage, failed.err
    if isinstance(err, ConnectionRefusedError):
        return "connection refused"  # nothing listens (yet): a broker still starting
    if stage == "handshake" and isinstance(err, TimeoutError):
        return (
            f"no TLS handshake: the clients speak TLS ({_tls_setting()}), the broker "
            "apparently does not"
        )
    if isinstance(err, ssl.SSLError):
        return f"TLS handshake failed: {err.reason or err}"
    if stage == "answer" and not tls and isinstance(err, (ConnectionError, ValueError)):
        return (
            f"{err} on a plaintext request: the broker apparently expects TLS "
            f"({BROKER_TLS_ENV} or security.broker.tls)"
        )
    return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


def probe_broker(bootstrap: str, bound: float) -> None:
    """Return once a broker of ``bootstrap`` answers a Kafka request; BrokerUnreachable (one line)
    after ``bound`` seconds of failed attempts."""
    security = kafka_security()
    tls = security.get("security_protocol") in ("SSL", "SASL_SSL")
    context = None
    if tls:
        context = security.get("ssl_context") or ssl.create_default_context()
    addresses = []
    for address in bootstrap.split(","):
        name, _, number = address.strip().rpartition(":")
        addresses.append((name.strip("[]") or "127.0.0.1", int(number)))
    deadline = time.monotonic() + bound
    last = "no attempt"
    while True:
        for host, port in addresses:
            remaining = deadline - time.monotonic()
            try:
                _exchange(host, port, context, max(0.1, min(_ATTEMPT_SECONDS, remaining)))
                return
            except _Failed as failed:
                where = f"{host}:{port}: " if len(addresses) > 1 else ""
                last = where + _diagnosis(failed, tls)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise BrokerUnreachable(
                f"the broker at {bootstrap} did not answer a Kafka request within {bound:g} s "
                f"({last})"
            )
        time.sleep(min(0.5, remaining))
