"""The `dpstream` command line run as an operator runs it: one command at a time, or `up` in the
background, on a small two-release deployment in the test's own ``DPSTREAM_HOME``.

The ``deployment`` fixture is imported by the test files that use it (pytest finds fixtures among a
module's names)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

N, T = 800, 4


def dpstream(*args, env, timeout=120, check=True):
    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", *args], capture_output=True,
                          text=True, env=env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"dpstream {' '.join(args)} exited {proc.returncode}: "
                             f"{proc.stderr[-2000:]}")
    return proc


@pytest.fixture
def deployment(tmp_path):
    cfg = {
        "name": "cli-test",
        "roster": {"size": N},
        "horizon": T,
        "topics": {"partitions": 2},
        "attributes": {"poverty": {"type": "binary"}},
        "budget": {"rho": 0.5},
        "random": {"kind": "seeded", "seed": 3},
        "releases": [
            {"name": "quarterly", "type": "fixed_window", "attribute": "poverty", "window": 2,
             "share": 0.5},
            {"name": "cumulative", "type": "cumulative", "attribute": "poverty", "share": 0.5},
        ],
    }
    path = tmp_path / "cli.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, DPSTREAM_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1")
    return path, env


@contextlib.contextmanager
def running(path, env, tmp_path, *up_args: str):
    """`dpstream up` in the background (one worker; ``up_args``: more options of `up`); yields the
    broker address; stops it after. Meanwhile
    this process's clients hold the curator's client certificate of its broker's gate, as the commands
    do (``pipeline.connections.kafka_security()`` for a test's own Kafka clients)."""
    from pipeline.stream.local.broker_tls import BROKER_TLS_ENV

    up = subprocess.Popen([sys.executable, "-m", "pipeline.cli", "up", "--config", str(path),
                           "--workers", "1", "--log-dir", str(tmp_path / "logs"), *up_args],
                          env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True)
    try:
        banner = up.stdout.readline()
        assert "dpstream up: broker" in banner, banner
        name = yaml.safe_load(Path(path).read_text())["name"]
        record = json.loads((Path(env["DPSTREAM_HOME"]) / f"{name}.json").read_text())
        if record.get("broker_tls"):
            os.environ[BROKER_TLS_ENV] = record["broker_tls"]
        yield banner.split("broker ", 1)[1].split(",", 1)[0]
    finally:
        os.environ.pop(BROKER_TLS_ENV, None)
        os.killpg(up.pid, signal.SIGINT)
        up.wait(timeout=60)
