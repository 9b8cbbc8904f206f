"""A client whose protocol does not match its broker is told in one line what it needs.

Real brokers: the embedded broker behind its mutual-TLS gate (as `dpstream up` runs it) and a plain
one. A TLS client at the plain broker (a tool run with `DPSTREAM_BROKER_TLS` left set) used to wait
for ever in kafka-python's handshake; a plain one at the gate (a tool without the deployment's
client files) retried until its bootstrap timeout and said only that it could not bootstrap. The
curator's example reader takes the client files and reads through the gate.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from pipeline.config import load_config
from pipeline.stream.kafka.topics import ensure_topics
from pipeline.stream.local.broker_tls import BROKER_TLS_ENV
from pipeline.stream.local.embedded import EmbeddedServices

ROOT = Path(__file__).resolve().parents[1]
NAME = "listener-check"
TLS_HINT = "set DPSTREAM_BROKER_TLS to the directory `broker_tls` names"


@pytest.fixture(scope="module")
def brokers(tmp_path_factory):
    """(gated services, plain services, configuration path), the gated broker's topics created."""
    tmp = tmp_path_factory.mktemp("listener")
    path = tmp / "deployment.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": NAME,
                "roster": {"size": 10},
                "horizon": 2,
                "attributes": {"pov": {"type": "binary"}},
                "budget": {"rho": 0.5},
                "releases": [{"name": "cu", "type": "cumulative", "attribute": "pov", "share": 1}],
            }
        )
    )
    with EmbeddedServices(isolated=True) as gated, EmbeddedServices() as plain:
        assert gated.gate is not None
        os.environ[BROKER_TLS_ENV] = str(gated.gate.tls.directory)
        try:
            ensure_topics(gated.broker.bootstrap, load_config(path))
        finally:
            os.environ.pop(BROKER_TLS_ENV, None)
        yield gated, plain, path


def run(args: list[str], env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    began = time.monotonic()
    try:
        proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{' '.join(args[:4])} ... still waiting after {timeout:.0f} s")
    proc.seconds = time.monotonic() - began  # type: ignore[attr-defined]
    return proc


def clean_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != BROKER_TLS_ENV}
    return dict(env, DPSTREAM_HOME=str(tmp_path / "home"), **extra)


def test_a_tls_client_at_a_plain_broker_is_told_at_once(brokers, tmp_path):
    gated, plain, path = brokers
    env = clean_env(
        tmp_path,
        DPSTREAM_BROKER=plain.broker.bootstrap,
        **{BROKER_TLS_ENV: str(gated.gate.tls.directory)},
    )
    proc = run(
        [sys.executable, str(ROOT / "deploy" / "create_topics.py"), "--config", str(path)], env
    )
    assert proc.returncode != 0, proc.stdout
    said = proc.stderr.strip().splitlines()
    assert len(said) == 1, proc.stderr
    assert f"the broker at {plain.broker.bootstrap} speaks plain Kafka" in said[0], said[0]
    assert "unset DPSTREAM_BROKER_TLS" in said[0], said[0]
    assert proc.seconds < 30


def test_a_plain_command_at_the_gate_says_what_it_needs(brokers, tmp_path):
    gated, _, path = brokers
    proc = run(
        [sys.executable, "-m", "pipeline.cli", "query", "--broker", gated.broker.bootstrap]
        + f"--config {path} --release cu --step 1".split(),
        clean_env(tmp_path),
    )
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    said = proc.stderr.strip().splitlines()
    assert len(said) == 1, proc.stderr
    assert f"the broker at {gated.broker.bootstrap} closed a plain Kafka request" in said[0]
    assert TLS_HINT in said[0], said[0]
    assert proc.seconds < 10  # the client's own bootstrap would retry for longer


def test_a_stream_job_at_the_gate_without_the_client_files_says_what_it_needs(brokers, tmp_path):
    gated, _, path = brokers
    proc = run(
        [sys.executable, "-m", "jobs.releaser", "--config", str(path)]
        + f"--broker {gated.broker.bootstrap} --redis {gated.redis.url}".split(),
        clean_env(tmp_path),
    )
    assert proc.returncode == 1, proc.stderr[-2000:]
    said = [line for line in proc.stderr.splitlines() if line.startswith("dpstream: ")]
    assert said and TLS_HINT in said[-1], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_the_example_reader_reads_through_the_gate_with_the_client_files(brokers, tmp_path):
    gated, _, _ = brokers
    proc = run(
        [
            sys.executable,
            str(ROOT / "docs" / "examples" / "synthetic_to_pandas.py"),
            "--bootstrap",
            gated.broker.bootstrap,
            "--deployment",
            NAME,
            "--release",
            "cu",
            "--idle-seconds",
            "1",
            "--tls-dir",
            str(gated.gate.tls.directory),
        ],
        clean_env(tmp_path),
    )
    # it read the (empty) releases topic through the gate: nothing released yet
    assert "no manifest of release 'cu' on the releases topic" in proc.stderr, proc.stderr[-2000:]


def test_a_benchmark_ignores_the_client_files_of_another_deployments_gate(brokers, tmp_path):
    """A benchmark starts brokers of its own: `DPSTREAM_BROKER_TLS` left set in the shell (which
    made its clients wait for ever in a TLS handshake with its own plain broker) is dropped."""
    gated, _, _ = brokers
    tls_dir = str(gated.gate.tls.directory)
    proc = run(
        [
            sys.executable,
            "-m",
            "jobs.bench.bench_upload",
            "--n",
            "2000",
            "--out",
            str(tmp_path / "bench"),
        ],
        clean_env(tmp_path, **{BROKER_TLS_ENV: tls_dir}),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "bench_upload: ignoring DPSTREAM_BROKER_TLS" in proc.stderr
    assert "ratio raw / upload" in proc.stdout
