"""A job process's entry point: its arguments (with the environment as fallback, read once there), the
command line that starts it, and the exit codes of a refused state."""

from __future__ import annotations

import sys

import pytest
import yaml

from pipeline.stream.process.supervision import run_job
from pipeline.stream.process.runtime import Runtime, job_command
from pipeline.stream.state.identity import ConfigurationChanged, StateLost

ENV = ("DPSTREAM_CONFIG", "DPSTREAM_BROKER", "DPSTREAM_REDIS", "DPSTREAM_METRICS_PORT")


@pytest.fixture
def config(tmp_path, monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({
        "name": "job", "broker": "configured:9092", "redis": "redis://configured:6379/0",
        "roster": {"size": 10}, "horizon": 2, "attributes": {"pov": {"type": "binary"}}, "budget": {"rho": 1.0},
        "releases": [{"name": "cu", "type": "cumulative", "attribute": "pov", "share": 1.0}]}))
    return str(path)


def test_arguments_override_the_environment_which_overrides_the_configuration(config, monkeypatch):
    rt, level = Runtime.from_args("worker", ["--config", config])
    assert (rt.broker, rt.redis_url, rt.metrics_port, level) == ("configured:9092", "redis://configured:6379/0", 0,
                                                                 "info")
    monkeypatch.setenv("DPSTREAM_CONFIG", config)
    monkeypatch.setenv("DPSTREAM_BROKER", "env:1")
    monkeypatch.setenv("DPSTREAM_METRICS_PORT", "9400")
    rt, _ = Runtime.from_args("releaser", [])
    assert (rt.deployment.name, rt.broker, rt.redis_url, rt.metrics_port) == ("job", "env:1",
                                                                              "redis://configured:6379/0", 9400)
    rt, level = Runtime.from_args("releaser", ["--broker", "arg:2", "--redis", "redis://arg/0", "--loglevel", "warn"])
    assert (rt.broker, rt.redis_url, level) == ("arg:2", "redis://arg/0", "warn")


def test_a_job_without_configuration_is_refused_naming_the_argument(config, capsys):
    with pytest.raises(SystemExit) as exc:
        Runtime.from_args("worker", [])
    assert exc.value.code == 2 and "--config" in capsys.readouterr().err


def test_job_command_starts_the_role_module_with_its_endpoints(config):
    cmd = job_command("releaser", config, "b:1", "redis://r/0", "debug", metrics_port=7)
    assert cmd[:3] == [sys.executable, "-m", "jobs.releaser"]
    assert Runtime.from_args("releaser", cmd[3:])[0].broker == "b:1"
    with pytest.raises(ValueError, match="'ingest'"):
        job_command("ingest", config, "b:1", "redis://r/0")


@pytest.mark.parametrize("error, code, label", [(ConfigurationChanged("k: 3 -> 20"), 2, "configuration refused"),
                                                (StateLost("unknown releases"), 4, "state lost")])
def test_a_refused_state_exits_with_its_code_and_one_line(error, code, label, capsys):
    async def job():
        raise error

    with pytest.raises(SystemExit) as exc:
        run_job(job, "error")
    assert exc.value.code == code
    assert capsys.readouterr().err.strip() == f"dpstream: {label}: {error}"
