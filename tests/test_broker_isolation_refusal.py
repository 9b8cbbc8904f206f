"""Where no private network namespace can be made, `dpstream up` refuses to start its embedded
broker.

The environment is real, made without touching the machine's settings: `up` runs inside a user
namespace of its own (`unshare --user --map-root-user`) whose `user.max_user_namespaces` is set to
0 (the limit is per user namespace: this one and its children only), with CAP_SYS_ADMIN dropped
from the bounding set (`setpriv`), so neither a nested user namespace nor a bare network namespace
can be created: what a distribution with user namespaces disabled, or a container, gives. The
product runs unchanged: its gate's `unshare` calls fail in the kernel.

`up` must exit 1 with one line naming why (the limit), start nothing that outlives it, leave no
endpoints record behind; and what that line offers, `DPSTREAM_EMBEDDED_BROKER=open`, must run there.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from pipeline.stream.local.leftovers import process_environ
from support.cli import deployment  # noqa: F401 - a fixture

CLI = [sys.executable, "-m", "pipeline.cli"]
RUN_MARK = (
    "DPSTREAM_TEST_ISOLATION_RUN"  # inherited by everything `up` starts: found in /proc after
)
RESTRICT = (
    "echo 0 > /proc/sys/user/max_user_namespaces && "
    'exec setpriv --bounding-set=-sys_admin --inh-caps=-sys_admin "$@"'
)


def without_namespaces(command: list[str]) -> list[str]:
    """``command`` in a user namespace where no further user or network namespace can be made."""
    return ["unshare", "--user", "--map-root-user", "sh", "-c", RESTRICT, "sh", *command]


@pytest.fixture(scope="module")
def no_namespaces() -> None:
    """Skip unless the restricted environment can be made here and refuses both namespaces."""
    if not (shutil.which("unshare") and shutil.which("setpriv")):
        pytest.skip("needs util-linux's unshare and setpriv")
    probe = subprocess.run(
        without_namespaces(
            ["sh", "-c", "unshare --user true; echo user=$?; unshare --net true; echo net=$?"]
        ),
        capture_output=True,
        text=True,
        timeout=30,
    )
    if probe.returncode != 0 or "user=1" not in probe.stdout or "net=1" not in probe.stdout:
        pytest.skip(f"cannot make a namespace-less environment here: {probe.stderr.strip()[:200]}")
    assert "No space left on device" in probe.stderr  # the limit, not some other failure


def up_without_namespaces(path: Path, tmp_path: Path, *flags: str) -> list[str]:
    """`dpstream up` (one worker) where no namespace can be made."""
    logs = str(tmp_path / "logs")
    return without_namespaces(
        [*CLI, "up", "--config", str(path), "--workers", "1", *flags, "--log-dir", logs]
    )


def leftovers(mark: str) -> list[int]:
    """Pids of processes carrying ``RUN_MARK=mark`` in their environment."""
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            if f"{RUN_MARK}={mark}".encode() in process_environ(int(entry.name)):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_up_refuses_without_namespaces(no_namespaces, deployment, tmp_path):  # noqa: F811
    path, env = deployment
    mark = uuid.uuid4().hex
    env = dict(env, **{RUN_MARK: mark})
    env.pop("DPSTREAM_EMBEDDED_BROKER", None)
    proc = subprocess.run(
        up_without_namespaces(path, tmp_path),
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "dpstream up: broker" not in proc.stdout  # no banner: nothing claims to run
    said = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(said) == 1, proc.stderr
    assert said[0].startswith("dpstream: up: the embedded broker cannot be isolated: "), said[0]
    assert (
        "a user namespace: No space left on device: the limit user.max_user_namespaces is reached"
        in said[0]
    ), said[0]
    assert "a bare network namespace as root: Operation not permitted" in said[0], said[0]
    assert "DPSTREAM_EMBEDDED_BROKER=open" in said[0], said[0]
    assert leftovers(mark) == [], "processes of the refused `up` still run"
    home = Path(env["DPSTREAM_HOME"])
    assert not (home / "cli-test.json").exists()  # no endpoints record a later command would trust
    assert not (home / "cli-test.prometheus.json").exists()


def test_the_open_broker_offered_runs_there(no_namespaces, deployment, tmp_path):  # noqa: F811
    path, env = deployment
    mark = uuid.uuid4().hex
    env = dict(env, DPSTREAM_EMBEDDED_BROKER="open", **{RUN_MARK: mark})
    proc = subprocess.Popen(
        up_without_namespaces(path, tmp_path, "--ephemeral"),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: queue.Queue[str] = queue.Queue()
    reader = threading.Thread(target=lambda: [lines.put(line) for line in proc.stdout], daemon=True)
    reader.start()
    try:
        banner = lines.get(timeout=120)
        assert banner.startswith("dpstream up: broker "), banner
        warning = lines.get(timeout=30)
        assert "warning: the embedded broker at" in warning and "asks for no credentials" in warning
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        proc.wait(timeout=60)
        reader.join(timeout=30)
    assert proc.returncode == 0
    assert leftovers(mark) == []
