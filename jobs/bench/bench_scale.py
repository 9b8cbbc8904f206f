"""How the stream grows with the roster: step latency, memory and bytes at n = 10^5, 10^6, 10^7.

    python -m jobs.bench.bench_scale [--n 100000 1000000 10000000] [--steps 4] [--workers 2]
                                     [--json out/bench_scale.json] [--plot docs/scale.png]

For each n, on the embedded broker and Redis with the benchmark's releases (fixed window k = 3,
cumulative, heavy hitters tct over |X| = 10^6; jobs/bench/bench_stream.py), ``--workers`` worker
processes and the releaser: each step is sent as columnar batches (``ReportProducer.send_step``, a
batch at a time), ingested, closed and read back. Per step: ingest rate (reports / (send start ->
last report accepted)), close -> every record published (the releaser's gauge) and -> the whole
step read back, each process's resident set (VmRSS) and peak (VmHWM), and the bytes the step put
on the public ``releases`` and ``synthetic`` topics. Every figure comes from this one run per n;
the plot shows each against n on log-log axes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from jobs.bench import write_json
from jobs.bench.bench_stream import _accepted, _close, _config
from jobs.bench.own_broker import use_own_brokers


def _accepted_sum(ports: list[int]) -> float:
    """Reports accepted so far by the workers (0 while a worker's metrics are not up yet)."""
    try:
        return sum(_accepted(p) for p in ports)
    except OSError:
        return 0.0


def _status_kb(pid: int, field: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return float(line.split()[1])
    return float("nan")


def run_n(n: int, steps: int, workers: int, out: Path) -> dict:
    from pipeline.config import load_config
    from pipeline.stream.ingest.roster import Roster
    from pipeline.stream.local.cluster import LocalCluster
    from pipeline.stream.local.driver import StepDriver
    from pipeline.stream.local.embedded import EmbeddedServices

    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    row: dict = {"n": n, "workers": workers, "steps": []}
    with EmbeddedServices(broker_log=out / "broker.log") as svc:
        cfg_path = out / "scale.yaml"
        cfg_path.write_text(yaml.safe_dump(_config(n, 4, svc)))
        deployment = load_config(cfg_path)
        roster = Roster.from_config(deployment.roster)
        with LocalCluster(
            cfg_path, deployment, workers=workers, log_dir=out / "logs", metrics=True
        ) as cluster:
            ports = [cluster.metrics_ports[f"worker-{i}"] for i in range(workers)]
            drv = StepDriver(cluster.broker, deployment, roster, cluster.names, cluster=cluster)
            sizes: dict[str, int] = {}
            poll = drv.poll

            def counting_poll(
                timeout_ms: int = 100,
            ) -> None:  # bytes per public topic, as read back
                for tp, msgs in drv._consumer.poll(timeout_ms=timeout_ms).items():
                    for msg in msgs:
                        sizes[tp.topic] = (
                            sizes.get(tp.topic, 0) + len(msg.value) + len(msg.key or b"")
                        )
                        drv.timestamps.setdefault((tp.topic, msg.key), int(msg.timestamp))
                        drv._handlers[tp.topic](msg.value)

            drv.poll = counting_poll  # type: ignore[method-assign]  # wrapped to count the bytes read
            rport = cluster.metrics_ports["releaser"]
            total = 0.0
            for t in range(1, steps + 1):
                pov = (rng.random(n) < 0.12).astype(np.int8)
                item = rng.integers(0, 1_000_000, size=n).astype(np.int32)
                item[: n // 50] = 12345
                started = time.perf_counter()
                drv.producer.send_step(t, {"poverty": pov, "item": item})
                sent = time.perf_counter() - started
                while _accepted_sum(ports) < total + n:
                    cluster.check_alive()
                    time.sleep(0.05)
                ingest = time.perf_counter() - started
                total += n
                before = dict(sizes)
                manifests, whole = _close(drv, t, rport)
                step: dict[str, Any] = {
                    "step": t,
                    "send_s": sent,
                    "ingest_reports_per_s": n / ingest,
                    "close_to_manifests_s": manifests,
                    "close_to_whole_step_s": whole,
                    "public_bytes": {
                        k.rsplit(".", 1)[-1]: v - before.get(k, 0) for k, v in sizes.items()
                    },
                }
                for name, proc in cluster.procs.items():
                    step[f"{name}_rss_mb"] = _status_kb(proc.pid, "VmRSS") / 1024
                    step[f"{name}_peak_mb"] = _status_kb(proc.pid, "VmHWM") / 1024
                row["steps"].append(step)
                print(
                    f"n={n:,} step {t}: ingest {n / ingest:,.0f} reports/s, close -> manifests {manifests:.2f} s, "
                    f"-> whole step {whole:.2f} s; RSS "
                    + ", ".join(
                        f"{k[:-7]} {v:.0f} MB" for k, v in step.items() if k.endswith("_rss_mb")
                    )
                    + "; public bytes "
                    + ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in step["public_bytes"].items()),
                    flush=True,
                )
            drv.poll = poll  # type: ignore[method-assign]  # the driver's own again
            drv.shutdown()
    return row


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ns = [r["n"] for r in rows]

    def med(r, key):
        values = [
            s[key] for s in r["steps"][1:] or r["steps"] if key in s
        ]  # step 1 includes group joins
        return float(np.median(values)) if values else float("nan")

    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    ax = axes[0]
    ax.plot(
        ns,
        [med(r, "close_to_manifests_s") for r in rows],
        "o-",
        label="close → manifests published",
    )
    ax.plot(
        ns,
        [med(r, "close_to_whole_step_s") for r in rows],
        "s-",
        label="close → whole step read back",
    )
    ax.set_title("release latency per step (median)")
    ax.set_ylabel("seconds")
    ax = axes[1]
    for name in sorted(
        {k[:-7] for r in rows for s in r["steps"] for k in s if k.endswith("_rss_mb")}
    ):
        ax.plot(ns, [med(r, f"{name}_peak_mb") for r in rows], "o-", label=f"{name} (peak RSS)")
    ax.set_title("process memory")
    ax.set_ylabel("MB")
    ax = axes[2]
    for topic in ("releases", "synthetic"):
        ax.plot(
            ns,
            [max(s["public_bytes"].get(topic, 0) for s in r["steps"]) / 1e6 for r in rows],
            "o-",
            label=f"{topic} topic (largest step)",
        )
    ax.plot(
        ns,
        [med(r, "ingest_reports_per_s") / 1e3 for r in rows],
        "^--",
        label="send → all accepted (k reports/s)",
    )
    ax.set_title("public MB per step; ingest rate")
    for ax in axes:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("users n")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(
        f"dpstream against n: embedded broker and Redis, {rows[0]['workers']} workers, fixed window + "
        "cumulative + heavy hitters (one run per n)",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv=None) -> list[dict]:
    use_own_brokers("bench_scale")  # never a running `up`'s gate
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, nargs="+", default=[100_000, 1_000_000, 10_000_000])
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--out", default="out/bench_scale")
    ap.add_argument("--replot", default=None, help="only draw --plot from this earlier --json")
    args = ap.parse_args(argv)
    if args.replot:
        rows = json.loads(Path(args.replot).read_text())
        plot(rows, Path(args.plot))
        return rows
    rows = []
    for n in args.n:
        rows.append(run_n(n, args.steps, args.workers, Path(args.out) / f"n{n}"))
        write_json(args.json, rows)  # after every n: a later, larger n may not finish
    if args.plot:
        plot(rows, Path(args.plot))
    return rows


if __name__ == "__main__":
    main()
