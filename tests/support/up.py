"""`dpstream up` in the background with its output in a file, and `dpstream status` read back, for
the tests of a durable, supervised `up` (the deployment of :mod:`support.cli`)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time

from support.cli import dpstream


class Up:
    """`dpstream up` in the background; its output (banner, supervision lines) in a file."""

    def __init__(self, path, env, tmp_path, workers=2):
        self.out = tmp_path / f"up-{time.monotonic_ns()}.out"
        self.logs = tmp_path / "logs"
        self.home = tmp_path / "home"
        command = [sys.executable, "-m", "pipeline.cli", "up", "--config", str(path),
                   "--workers", str(workers), "--log-dir", str(self.logs)]
        self.proc = subprocess.Popen(command, env=env, stdout=self.out.open("w"),
                                     stderr=subprocess.STDOUT, start_new_session=True)

    def text(self) -> str:
        return self.out.read_text()

    def wait_for(self, pattern: str, timeout: float = 60.0) -> re.Match:
        deadline = time.monotonic() + timeout
        while True:
            found = re.search(pattern, self.text())
            if found:
                return found
            assert self.proc.poll() is None, f"up exited {self.proc.returncode}: {self.text()}"
            assert time.monotonic() < deadline, (f"no {pattern!r} within {timeout:.0f} s: "
                                                 f"{self.text()}")
            time.sleep(0.2)

    def started(self) -> dict[str, int]:
        self.wait_for("dpstream up: broker")
        record = json.loads((self.home / "cli-test.json").read_text())
        return {name: p["pid"] for name, p in record["processes"].items()}

    def stop(self) -> int:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
        return self.proc.wait(timeout=90)


@contextlib.contextmanager
def up(path, env, tmp_path, workers=2):
    run = Up(path, env, tmp_path, workers)
    try:
        run.started()
        yield run
    finally:
        run.stop()


def status_json(path, env) -> dict:
    """`dpstream status --json`."""
    proc = dpstream("status", "--config", str(path), "--json", env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def wait_released(path, env, step: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while status_json(path, env)["released_step"] < step:
        assert time.monotonic() < deadline, f"step {step} not released within {timeout:.0f} s"
        time.sleep(0.3)
