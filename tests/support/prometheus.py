"""A real Prometheus server (the Debian package's /usr/bin/prometheus, installed by
scripts/install-prometheus.sh) scraping the given targets each second, queried through its HTTP
API."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from pipeline.stream.local.embedded import free_port

PROMETHEUS = "/usr/bin/prometheus"


class Prometheus:
    @staticmethod
    def require() -> None:
        if not Path(PROMETHEUS).exists():
            pytest.fail(f"{PROMETHEUS} not found: run scripts/install-prometheus.sh (installs the "
                        "Debian package `prometheus`; `make test` does it)", pytrace=False)

    def __init__(self, workdir: Path, targets: dict[str, list[int]]):
        self.require()
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        config = {
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                       "evaluation_interval": "1s"},
            "scrape_configs": [
                {"job_name": job,
                 "static_configs": [{"targets": [f"127.0.0.1:{p}" for p in ports]}]}
                for job, ports in targets.items()
            ],
        }
        (self.dir / "prometheus.yml").write_text(yaml.safe_dump(config))
        self.log = open(self.dir / "prometheus.log", "wb")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={self.dir / 'prometheus.yml'}",
             f"--storage.tsdb.path={self.dir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--storage.tsdb.retention.time=1h"],
            stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def query(self, expr: str) -> list[dict]:
        query = urllib.parse.urlencode({"query": expr})
        url = f"http://127.0.0.1:{self.port}/api/v1/query?{query}"
        with urllib.request.urlopen(url, timeout=5) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        return body["data"]["result"]

    def value(self, expr: str) -> float:
        result = self.query(expr)
        assert len(result) == 1, f"{expr}: {result}"
        return float(result[0]["value"][1])

    def by(self, expr: str, label: str) -> dict[str, float]:
        return {r["metric"][label]: float(r["value"][1]) for r in self.query(expr)}

    def wait(self, expr: str, want, timeout: float = 60.0):
        """Poll ``expr`` until ``want(result)``; the last result either way."""
        deadline, result = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                pytest.fail(f"prometheus exited with {self.proc.returncode}; "
                            f"see {self.dir / 'prometheus.log'}")
            try:
                result = self.query(expr)
                if want(result):
                    return result
            except OSError:
                pass  # not listening yet
            time.sleep(0.5)
        return result

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        self.log.close()
