"""Both ends of the pipe through the command line against a running deployment (`dpstream up`: real
embedded broker, Redis and processes): a producer sending an Excel-style CSV (byte-order mark) after a
dry run, then an analyst with no Redis at all — a configuration naming only the broker, no `dpstream up`
record — reading labelled answers, exports with their dictionary, alerts and the report page. The
commands run in this process (``pipeline.cli.main``), as a subprocess each would spend most of the
test starting Python."""

from __future__ import annotations

import csv
import json
import os
import time

from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.cli import main
from pipeline.connections import kafka_security
from support.cli import running

N, T = 600, 3


@pytest.fixture
def deployment(tmp_path):
    cfg = {
        "name": "analyst-cli", "roster": {"size": N}, "horizon": T, "topics": {"partitions": 2},
        "steps": {"unit": "month"},
        "attributes": {"poverty": {"type": "binary", "label": "poor"},
                       "job": {"type": "categorical", "values": ["nurse", "driver", "cook"]}},
        "budget": {"rho": 0.5, "epsilon": 2.0, "delta": 1e-6},
        "random": {"kind": "seeded", "seed": 5},
        "releases": [
            {"name": "quarterly", "type": "fixed_window", "attribute": "poverty", "window": 2, "share": 0.5},
            {"name": "cumulative", "type": "cumulative", "attribute": "poverty", "share": 0.5},
            {"name": "jobs", "type": "heavy_hitters", "attribute": "job", "k": 2, "share": 1.0},
        ],
    }
    path = tmp_path / "analyst.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = dict(os.environ, DPSTREAM_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1")
    return cfg, path, env


def _write_csv(path, step, bom: bool):
    with path.open("w", newline="", encoding="utf-8-sig" if bom else "utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["user", "step", "poverty", "job"])
        for i in range(N):
            w.writerow([f"u{i}", step, int(i % 5 == 0), "nurse" if i < N // 2 else "cook"])


def _reports_sent(broker: str) -> int:
    from kafka import TopicPartition

    from pipeline.stream.kafka.log_end import log_ends

    ends = log_ends(broker, [TopicPartition("dpstream.analyst-cli.reports", p) for p in range(2)])
    return sum(ends.values())


def test_producer_and_analyst_ends(deployment, tmp_path, capsys, monkeypatch):
    cfg, path, env = deployment
    c = ["--config", str(path)]
    monkeypatch.setenv("DPSTREAM_HOME", env["DPSTREAM_HOME"])

    def dpstream(*args, env=None, check=True):
        """``dpstream ARGS`` in this process: (returncode, stdout, stderr) as a subprocess would give them."""
        capsys.readouterr()
        if env is not None:
            monkeypatch.setenv("DPSTREAM_HOME", env["DPSTREAM_HOME"])
        try:
            code = main(list(args))
        except SystemExit as exit_:  # a refusal before the command starts (no such deployment, ...)
            code = exit_.code
        out, err = capsys.readouterr()
        if check:
            assert code == 0, (args, err[-2000:])
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)

    with running(path, env, tmp_path) as broker:
        # producer: an Excel "CSV UTF-8" file (BOM), checked by a dry run that sends nothing
        for t in range(1, T + 1):
            f = tmp_path / f"step{t}.csv"
            _write_csv(f, t, bom=(t == 1))
            if t == 1:
                out = dpstream("produce", *c, "--csv", str(f), "--dry-run", env=env).stdout
                assert out.startswith(f"dry run: {N:,} reports for step 1 pass the workers' checks, "
                                      "none a duplicate (exact for the 0 records on the reports log")
                assert _reports_sent(broker) == 0  # the dry run sent nothing
            out = dpstream("produce", *c, "--csv", str(f), env=env).stdout
            assert f"sent {N} reports for step {t} (all acknowledged)" in out
            dpstream("close", *c, "--step", str(t), env=env)
        deadline = time.monotonic() + 90
        while json.loads(dpstream("status", *c, "--json", env=env).stdout)["published_step"] < T:
            assert time.monotonic() < deadline
            time.sleep(0.5)

        # a typo'd topic: the embedded broker (Tansu) would create it on the first send; the helper refuses
        from kafka import KafkaConsumer

        from pipeline.config import load_config
        from pipeline.producer import ReportSender, TopicMissing

        with ReportSender(load_config(path), broker, topic="dpstream.analyst-cli.report") as sender:
            with pytest.raises(TopicMissing, match="does not exist"):
                sender.check_topic()
        assert "dpstream.analyst-cli.report" not in KafkaConsumer(bootstrap_servers=broker,
                                                                 **kafka_security()).topics()

        # curator side: nothing was rejected
        assert "no rejected reports" in dpstream("dead-letters", *c, env=env).stdout

        # the analyst: the broker only, no Redis anywhere, no `dpstream up` record to find one in
        analyst = tmp_path / "analyst-only.yaml"
        analyst.write_text(yaml.safe_dump(dict(cfg, broker=broker)))
        aenv = dict(env, DPSTREAM_HOME=str(tmp_path / "analyst-home"))
        a = ["--config", str(analyst)]
        import redis

        def no_redis(*args, **kw):
            raise AssertionError("an analyst's command sent a Redis command")

        monkeypatch.setattr(redis.Redis, "execute_command", no_redis)  # in this process, where the commands run
        proc = dpstream("status", *a, env=aenv, check=False)  # the operator's command needs Redis: refused
        assert proc.returncode == 2 and "names no broker/Redis" in proc.stderr

        text = dpstream("query", *a, "--release", "quarterly", "--step", "2", env=aenv).stdout
        assert "poor in all 2 months (11)" in text and "of n" in text and "padding removed" in text
        q = json.loads(dpstream("query", *a, "--release", "quarterly", "--step", "2", "--json", env=aenv).stdout)
        truth = {0: N - N // 5, 3: N // 5}  # every fifth user poor in both months, the rest in neither
        for row in q["rows"]:
            lo, hi = row["interval"]
            assert lo <= truth.get(row["key"], 0) <= hi, row  # λ's interval holds (probability ≥ 95%, seeded)
            assert row["share"] == row["estimate"] / N
        proc = dpstream("query", *a, "--release", "jobs", "--step", "1", env=aenv, check=False)
        assert proc.returncode == 2 and "`dpstream alerts` reads them" in proc.stderr

        out = dpstream("export", *a, "--release", "quarterly", "--out", str(tmp_path / "q.parquet"), env=aenv).stdout
        assert "data dictionary in the Parquet schema metadata" in out
        meta = json.loads(pq.read_table(tmp_path / "q.parquet").schema.metadata[b"dpstream"])
        assert meta["n"] == N and meta["released_through"] == T and meta["patterns"]["3"] == "poor in all 2 months (11)"
        dpstream("export", *a, "--release", "cumulative", "--out", str(tmp_path / "c.csv"), env=aenv)
        assert json.loads((tmp_path / "c.csv.dictionary.json").read_text())["release"] == "cumulative"
        proc = dpstream("export", *a, "--release", "quarterly", "--out", "/nonexistent/q.csv", env=aenv, check=False)
        assert proc.returncode == 2 and "does not exist" in proc.stderr and len(proc.stderr.splitlines()) == 1

        alerts = dpstream("alerts", *a, env=aenv).stdout
        assert "step   1  jobs: flagged:" in alerts and "nurse" in alerts and "k = 2" in alerts
        assert "flags are now spent" in alerts
        report = tmp_path / "page"
        assert "report.html" in dpstream("report", *a, "--out", str(report), env=aenv).stdout
        assert "poor in all 2 months (11)" in (report / "report.html").read_text()
