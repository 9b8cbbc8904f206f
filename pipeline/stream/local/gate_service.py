"""The broker gate as a supervised process, and the probes that say when what is behind it answers.

:class:`BrokerGate` starts :mod:`pipeline.stream.local.broker_gate` and learns from it whether it holds a
private network namespace; the embedded broker and object store are then started inside that namespace
(:meth:`BrokerGate.enter`). Their own ports cannot be probed from the host, so readiness is checked
through the gate: a Kafka ``ApiVersions`` round trip over mutual TLS for the broker, an HTTP answer for
the object store.

Inside, the broker listens on the gate's own port number: the address it advertises in its metadata
(``127.0.0.1:<gate port>``, what clients outside reach through the gate) is then the broker itself for a
client inside the namespace, which is how ``dpstream up`` makes a restarted broker's topics while the
gate is held (:meth:`BrokerGate.hold`).
"""

from __future__ import annotations

import socket
import ssl
import struct
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.stream.local.broker_gate import enter_command
from pipeline.stream.local.broker_tls import BrokerTls
from pipeline.stream.local.service_process import _ServiceProcess, free_port, open_private_log

__all__ = [
    "BrokerGate",
    "GateUnavailable",
    "client_context",
    "wait_for_http",
    "wait_for_kafka",
]

_API_VERSIONS_V0 = struct.pack(
    ">ihhih", 10, 18, 0, 1, -1
)  # size, api key, version, correlation id, no client id


class GateUnavailable(RuntimeError):
    """The gate could not isolate the broker (e.g. user namespaces disabled for this user)."""


def client_context(tls: BrokerTls) -> ssl.SSLContext:
    """The curator's client side: the deployment's authority only, the client certificate presented."""
    context = ssl.create_default_context(cafile=str(tls.ca_file))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(tls.client_cert, tls.client_key)
    return context


def _retry_until(attempt, what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if attempt():
                return
        except (OSError, ssl.SSLError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not answer within {timeout:.0f} s")
        time.sleep(0.05)


def wait_for_kafka(port: int, tls: BrokerTls, timeout: float = 20.0) -> None:
    """Until a broker answers ``ApiVersions`` at 127.0.0.1:``port`` over mutual TLS."""
    context = client_context(tls)

    def attempt() -> bool:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=2) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as conn,
        ):
            conn.sendall(_API_VERSIONS_V0)
            return len(conn.recv(4)) > 0

    _retry_until(attempt, f"the embedded broker behind 127.0.0.1:{port}", timeout)


def wait_for_http(port: int, timeout: float = 20.0) -> None:
    """Until an HTTP server answers at 127.0.0.1:``port`` (any status: it is up)."""

    def attempt() -> bool:
        with socket.create_connection(("127.0.0.1", port), timeout=2) as conn:
            conn.sendall(b"HEAD / HTTP/1.0\r\n\r\n")
            return conn.recv(5) == b"HTTP/"

    _retry_until(attempt, f"the object store behind 127.0.0.1:{port}", timeout)


@dataclass
class BrokerGate(_ServiceProcess):
    """The gate's process: TLS on 127.0.0.1:``port`` and, with ``store_port``, the object store's port.

    ``up`` keeps one end of a unix socket to it (its control: :mod:`pipeline.stream.local.broker_gate`)
    to hold it closed to the broker's clients and open it again."""

    tls: BrokerTls
    port: int = field(default_factory=free_port)
    store_port: int | None = None
    log_path: Path | None = None
    mode: str | None = None  # "user" or "net" once started (pipeline.stream.local.broker_gate)
    held: bool = field(default=False, init=False)  # turning every client of the broker away
    _proc: subprocess.Popen | None = field(default=None, init=False, repr=False)
    _control: socket.socket | None = field(default=None, init=False, repr=False)

    def start(self, timeout: float = 20.0, held: bool = False) -> BrokerGate:
        """Start the gate; ``held``: closed to the broker's clients until :meth:`admit`."""
        ours, theirs = socket.socketpair()
        self.command = [
            sys.executable,
            "-m",
            "pipeline.stream.local.broker_gate",
            "--tls-port",
            str(self.port),
            "--broker-port",
            str(self.port),  # the same number inside (the module's docstring)
            "--tls-dir",
            str(self.tls.directory),
            "--control-fd",
            str(theirs.fileno()),
            *(["--held"] if held else []),
        ]
        if self.store_port:
            self.command += ["--store-port", str(self.store_port)]
        log = open_private_log(self.log_path) if self.log_path else None
        try:
            self._proc = subprocess.Popen(
                self.command,
                stdout=log or subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
            if log is not None:
                log.close()
        self._control = ours
        line = self._answer(timeout) or "error no answer within the timeout"
        kind, _, detail = line.partition(" ")
        if kind != "ready":
            self.stop()
            raise GateUnavailable(
                f"the embedded broker cannot be isolated: {detail or 'the gate exited'}; "
                "DPSTREAM_EMBEDDED_BROKER=open runs it reachable by every local user"
            )
        self.mode, self.held = detail, held
        return self

    def hold(self, timeout: float = 10.0) -> None:
        """Close the broker's port to every client from now on (each connection closed once accepted, as
        when the broker is down) until :meth:`admit`; returns once the gate applies it."""
        self._command("hold", "held", timeout)
        self.held = True

    def admit(self, timeout: float = 10.0) -> None:
        """Forward the broker's clients again (after :meth:`hold`, or a start ``held``)."""
        self._command("open", "open", timeout)
        self.held = False

    def _command(self, command: str, answer: str, timeout: float) -> None:
        if self._control is None:
            raise RuntimeError("the broker gate is not running")
        try:
            self._control.sendall(f"{command}\n".encode())
            got = self._answer(timeout)
        except OSError as err:
            got = f"error {err}"
        if got != answer:
            raise RuntimeError(f"the broker gate did not {command}: {got or 'no answer'}")

    def _answer(self, timeout: float) -> str:
        """The gate's next line on the control socket ('' when it closed it or said nothing in time)."""
        assert self._control is not None
        self._control.settimeout(timeout)
        data = b""
        try:  # one line per command: nothing of a later answer can be read here
            while not data.endswith(b"\n"):
                chunk = self._control.recv(256)
                if not chunk:
                    break
                data += chunk
        except TimeoutError:
            pass
        return data.decode(errors="replace").strip()

    def stop(self) -> None:
        super().stop()
        if self._control is not None:
            self._control.close()
            self._control = None
        self.held = False

    def enter(self) -> list[str]:
        """The command prefix that starts a process inside the gate's private network."""
        if self.pid is None or self.mode is None:
            raise RuntimeError("the broker gate is not running")
        return enter_command(self.pid, self.mode)
