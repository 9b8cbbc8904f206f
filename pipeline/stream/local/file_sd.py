"""A Prometheus ``file_sd`` targets file for a local `dpstream up`.

`up` gives each worker and the releaser a free metrics port, and a restarted process gets a new
one, so a fixed scrape configuration cannot name them. `up` writes them to
``DPSTREAM_HOME/<deployment>.prometheus.json`` in Prometheus's file-based service discovery format
(one target group per process: ``targets`` ``["<addr>:<port>"]``, ``labels`` ``job``,
``deployment``, ``process``) whenever they change, and removes it when it stops. Point a scrape job at it:

    scrape_configs:
      - job_name: dpstream
        file_sd_configs: [{files: ["/home/me/.dpstream/sipp-poverty.prometheus.json"]}]

The file is replaced atomically (written beside it, then renamed): Prometheus re-reads it on change.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

__all__ = ["targets_file", "write_targets"]


def targets_file(deployment_name: str) -> Path:
    from pipeline.stream.local.cluster import dpstream_home

    return dpstream_home() / f"{deployment_name}.prometheus.json"


def write_targets(path: Path, deployment_name: str, ports: dict[str, int]) -> None:
    """Write one target group per process of ``ports`` (process name -> metrics port)."""
    addr = os.environ.get("DPSTREAM_METRICS_ADDR") or "127.0.0.1"  # where serve_metrics listens
    groups = [
        {
            "targets": [f"{addr}:{port}"],
            "labels": {
                "job": f"dpstream-{name.split('-')[0]}",
                "deployment": deployment_name,
                "process": name,
            },
        }
        for name, port in sorted(ports.items())
    ]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(groups, indent=2) + "\n")
    os.replace(tmp, path)
