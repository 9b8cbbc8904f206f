"""What the embedded services' processes share, below :mod:`pipeline.stream.local.embedded` and the
broker's gate: owner-only files and folders, free loopback ports, and a service run as a child process
in its own session (started, waited for, stopped)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from pathlib import Path

__all__ = [
    "private_dir",
    "private_file",
    "open_private_log",
    "pid_alive",
    "free_port",
    "wait_for_port",
]


def private_dir(path: Path, narrow: bool = True) -> Path:
    """``path`` created owner-only (0700), with its missing parents. An existing directory is narrowed to 0700
    too when ``narrow`` (one dpstream owns), else left as it is (one the user named, which may be shared:
    ``--log-dir /tmp``); what dpstream writes inside is owner-only either way."""
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        path.chmod(0o700)
    elif narrow:
        path.chmod(0o700)
    return path


def private_file(path: Path, text: str) -> None:
    """Write ``text`` to ``path``, owner-only (0600) from its creation, atomically (readers never see half)."""
    partial = path.with_name(path.name + ".partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.chmod(partial, 0o600)  # an older partial of another mode
    os.replace(partial, path)


def open_private_log(path: Path):
    """``path`` opened for appending, owner-only (0600, an existing file's mode narrowed too): logs name
    endpoints and what the processes did."""
    fh = open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600), "ab")  # noqa: SIM115  (returned)
    os.chmod(path, 0o600)
    return fh


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (a zombie child is reaped and counts as gone)."""
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)  # reap it if it is our child
        if waited == pid:
            return False
    except ChildProcessError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # alive, another user's
    try:  # a zombie (exited, not yet reaped by its parent) still answers kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def free_port() -> int:
    """A currently free TCP port on the loopback interface."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, host: str = "127.0.0.1", timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"nothing answered on {host}:{port} within {timeout:.0f} s"
                ) from None
            time.sleep(0.05)


def _stop_process(proc: subprocess.Popen | None, grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds (the broker waits for its clients' connections to
    close; what it acknowledged is already in its storage)."""
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


class _ServiceProcess:
    """A service run as a child process in its own session, its output appended to ``log_path``."""

    log_path: Path | None
    port: int
    _proc: subprocess.Popen | None

    command: list[str] | None = None  # what it was started with (recorded for `down`)

    def _launch(self, cmd: list[str], env: dict[str, str], timeout: float) -> None:
        # what /proc shows once it runs (`down` compares them): nsenter execs the command after its "--"
        self.command = cmd[cmd.index("--") + 1 :] if cmd[0] == "nsenter" else list(cmd)
        log = open_private_log(self.log_path) if self.log_path else subprocess.DEVNULL
        try:
            self._proc = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            if not isinstance(log, int):  # subprocess.DEVNULL is an int
                log.close()  # the child holds its own descriptor (restarts must not leak one per start)
        try:
            self._wait_ready(timeout)
        except TimeoutError:
            self.stop()
            raise

    def _wait_ready(self, timeout: float) -> None:
        wait_for_port(self.port, timeout=timeout)

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def stop(self) -> None:
        _stop_process(self._proc)
        self._proc = None
