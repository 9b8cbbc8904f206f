"""The only way into the embedded broker: a mutual-TLS gate on host loopback in front of a private network.

Tansu (the embedded broker) cannot check a credential (:mod:`pipeline.stream.local.broker_access`), so it
must not be reachable by anyone who could lack one. This process:

1. binds its listening sockets on the host's 127.0.0.1 — the TLS port clients use, and, for a durable log,
   a plain port for the object store (which checks its own access key; ``up``'s log retention uses it);
2. moves itself into a new network namespace (inside a new user namespace when the kernel allows it, as
   any user can; as root, a bare network namespace otherwise) and brings its loopback up. Sockets keep the
   namespace they were created in: the two listeners stay on the host, every connection it opens from now
   on is inside;
3. forwards each accepted connection to the same service inside: a TLS connection only after the client
   presented a certificate signed by the deployment's authority (:mod:`pipeline.stream.local.broker_tls`).

The broker and the object store are started inside this namespace with ``nsenter`` (:func:`enter_command`):
their loopback ports exist in no other namespace, and only this user (or root) can enter it. Another local
user reaches the TLS port and nothing else, and without the client key cannot complete a handshake.

While *held*, the gate closes every connection to the broker's port as soon as it is accepted, as if the
broker were still down (clients retry). ``dpstream up`` holds it while a broker whose log is memory-only
restarts: it makes the deployment's topics from inside the namespace before any client can name one,
which the broker would otherwise create with its own default partition count.

Run as ``python -m pipeline.stream.local.broker_gate --tls-port Q --broker-port P [--store-port S]
--tls-dir DIR --control-fd N [--held]``, fd N one end of a connected unix socket: the gate writes
``ready <mode>`` (``user`` or ``net``) or ``error <why>`` on it, then takes the lines ``hold`` and ``open``,
answering ``held`` or ``open`` once the new state applies to every connection accepted after.
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import errno
import fcntl
import os
import socket
import ssl
import struct
import sys
from pathlib import Path

__all__ = ["Hold", "enter_command", "enter_private_network", "main", "server_context"]

CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CHUNK = 1 << 18


def enter_private_network() -> str:
    """Move this (single-threaded) process into a new network namespace with its loopback up; which kind:
    ``user`` (a user namespace owning it, mapping this uid to root inside) or ``net`` (root only)."""
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.geteuid(), os.getegid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) == 0:
        try:
            Path("/proc/self/setgroups").write_text("deny")
            Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
            Path("/proc/self/gid_map").write_text(f"0 {gid} 1")
        except OSError as err:
            raise OSError(f"cannot map this user into its new user namespace ({err})") from None
        mode = "user"
    else:
        why = _user_namespace_refusal(ctypes.get_errno())
        if uid != 0:
            raise OSError(f"cannot create a private network namespace: {why}")
        if libc.unshare(CLONE_NEWNET) != 0:
            bare = os.strerror(ctypes.get_errno())
            raise OSError(
                f"cannot create a private network namespace: {why}; a bare network namespace as "
                f"root: {bare} (CAP_SYS_ADMIN withheld, e.g. in a container)"
            )
        mode = "net"
    _loopback_up()
    return mode


def _user_namespace_refusal(code: int) -> str:
    """Why ``unshare(CLONE_NEWUSER)`` failed, with the kernel setting that usually says so."""
    causes = {
        errno.ENOSPC: "the limit user.max_user_namespaces is reached (0 disables them)",
        errno.EPERM: "refused (kernel.unprivileged_userns_clone=0, an AppArmor or seccomp "
        "restriction on user namespaces)",
        errno.EUSERS: "user namespaces nested 32 deep",
        errno.EINVAL: "this kernel has no user namespaces",
    }
    cause = causes.get(code)
    return f"a user namespace: {os.strerror(code)}" + (f": {cause}" if cause else "")


def _loopback_up() -> None:
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    layout = "16sH22x"  # struct ifreq: the name, then the flags in the union
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        flags = struct.unpack(
            layout, fcntl.ioctl(sock, siocgifflags, struct.pack(layout, b"lo", 0))
        )[1]
        fcntl.ioctl(sock, siocsifflags, struct.pack(layout, b"lo", flags | iff_up))


def enter_command(gate_pid: int, mode: str) -> list[str]:
    """The prefix that runs a command inside the gate's network namespace."""
    if mode == "user":
        return [
            "nsenter",
            f"--target={gate_pid}",
            "--user",
            "--net",
            "--preserve-credentials",
            "--",
        ]
    return ["nsenter", f"--target={gate_pid}", "--net", "--"]


def server_context(tls_dir: Path) -> ssl.SSLContext:
    """TLS 1.2+, the server's certificate, and a client certificate required and checked against the
    deployment's authority (and nothing else: no system roots)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(tls_dir / "server.pem", tls_dir / "server.key")
    context.load_verify_locations(cafile=str(tls_dir / "ca.pem"))
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def _listener(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    return sock


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(CHUNK):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError, ssl.SSLError):
        pass
    finally:
        writer.close()


class Hold:
    """Whether the broker's port turns every client away (the gate's control socket sets it)."""

    def __init__(self, held: bool) -> None:
        self.held = held


def _forwarder(inner_port: int, hold: Hold | None = None):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if hold is not None and hold.held:  # what a client of a broker still down sees: it retries
            writer.close()
            return
        try:  # opened after the move: the service inside the private namespace
            inner_reader, inner_writer = await asyncio.open_connection("127.0.0.1", inner_port)
        except OSError:
            writer.close()
            return
        for sock in (writer.get_extra_info("socket"), inner_writer.get_extra_info("socket")):
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(_pump(reader, inner_writer), _pump(inner_reader, writer))

    return handle


# host listener, port inside, TLS or plain, the hold it obeys (None: always open)
Route = tuple[socket.socket, int, ssl.SSLContext | None, Hold | None]


async def _obey(control: socket.socket, hold: Hold) -> None:
    """The ``hold`` and ``open`` lines from ``dpstream up``, each answered once it applies."""
    try:
        reader, writer = await asyncio.open_unix_connection(sock=control)
        while line := await reader.readline():
            command = line.decode(errors="replace").strip()
            if command in ("hold", "open"):
                hold.held = command == "hold"
                writer.write(b"held\n" if hold.held else b"open\n")
            else:
                writer.write(f"error unknown command {command!r}\n".encode())
            await writer.drain()
    except (ConnectionError, OSError):
        pass  # `up` is gone: the gate keeps serving as it was, until it is stopped


async def _serve(routes: list[Route], control: socket.socket, hold: Hold) -> None:
    servers = [
        await asyncio.start_server(
            _forwarder(inner, held_by),
            sock=sock,
            ssl=context,
            ssl_handshake_timeout=10 if context else None,
        )
        for sock, inner, context, held_by in routes
    ]
    await asyncio.gather(*(server.serve_forever() for server in servers), _obey(control, hold))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.stream.local.broker_gate")
    ap.add_argument("--tls-port", type=int, required=True)
    ap.add_argument("--broker-port", type=int, required=True)
    ap.add_argument("--store-port", type=int)
    ap.add_argument("--tls-dir", type=Path, required=True)
    ap.add_argument("--control-fd", type=int, required=True)
    ap.add_argument("--held", action="store_true", help="start held (see the module's docstring)")
    args = ap.parse_args(argv)
    control = socket.socket(fileno=args.control_fd)
    hold = Hold(args.held)
    try:
        context = server_context(args.tls_dir)
        routes: list[Route] = [(_listener(args.tls_port), args.broker_port, context, hold)]
        if args.store_port:  # up's log retention only: the store checks its access key itself
            routes.append((_listener(args.store_port), args.store_port, None, None))
        mode = enter_private_network()  # after the listeners: they stay on the host
    except (OSError, ssl.SSLError) as err:
        control.sendall(f"error {err}\n".encode())
        return 1
    control.sendall(f"ready {mode}\n".encode())
    try:
        asyncio.run(_serve(routes, control, hold))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
