"""Whether a broker's listener speaks what the client is about to speak: plain Kafka or TLS.

A client whose protocol does not match its broker's listener fails badly: kafka-python's TLS
handshake against a plain Kafka listener (the embedded broker without its gate) waits for ever, and
a plain client at the embedded broker's mutual-TLS gate retries until its bootstrap timeout and then
says only that it could not bootstrap. One plain ``ApiVersions`` request, answered or not within a
few seconds, tells which it is before any client is built: a plain Kafka listener answers it with a
Kafka response; a TLS listener closes the connection or answers with a TLS record. No answer at all
(a broker still starting, a loaded machine) decides nothing and the client goes ahead as before.
"""

from __future__ import annotations

import socket
import struct

__all__ = ["ListenerMismatch", "check_listener"]

# size, api key 18 (ApiVersions), version 0, correlation id 7, no client id
_API_VERSIONS_V0 = struct.pack(">ihhih", 10, 18, 0, 7, -1)
_TLS_RECORD_TYPES = {0x15, 0x16}  # alert, handshake
_WHERE_GATE = (
    "the embedded broker of `dpstream up` takes only clients presenting its deployment's "
    "certificate: set DPSTREAM_BROKER_TLS to the directory `broker_tls` names in "
    "$DPSTREAM_HOME/<deployment>.json (docs/security.md)"
)


class ListenerMismatch(RuntimeError):
    """The broker's listener speaks another protocol than the client was configured for."""


def _plain_answer(host: str, port: int, timeout: float) -> str | None:
    """``kafka`` (a Kafka response), ``not-kafka`` (closed, or a TLS record) or None (no answer)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as conn:
            conn.settimeout(timeout)
            conn.sendall(_API_VERSIONS_V0)
            head = conn.recv(8)
    except (TimeoutError, ConnectionRefusedError, OSError):
        return None  # nothing listening yet, or too slow to tell
    if not head or head[0] in _TLS_RECORD_TYPES:
        return "not-kafka"
    if len(head) == 8 and struct.unpack(">i", head[4:8])[0] == 7:
        return "kafka"
    return None


def check_listener(bootstrap: str, security_protocol: str, timeout: float = 3.0) -> None:
    """Raise :class:`ListenerMismatch` (one line saying what the client needs) when the first
    address of ``bootstrap`` clearly speaks the other protocol than ``security_protocol``."""
    host, _, port = bootstrap.split(",")[0].strip().rpartition(":")
    if not port.isdigit():
        return
    answer = _plain_answer(host.strip("[]") or "127.0.0.1", int(port), timeout)
    wants_tls = security_protocol in ("SSL", "SASL_SSL")
    if wants_tls and answer == "kafka":
        raise ListenerMismatch(
            f"the broker at {bootstrap} speaks plain Kafka, but this client is set up for TLS "
            f"({security_protocol}): unset DPSTREAM_BROKER_TLS for a broker without the gate, or "
            "check security.broker.tls"
        )
    if not wants_tls and answer == "not-kafka":
        raise ListenerMismatch(
            f"the broker at {bootstrap} closed a plain Kafka request: it speaks TLS: "
            f"{_WHERE_GATE}; for a configured Kafka, the security.broker.tls block"
        )
