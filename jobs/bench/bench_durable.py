"""What the durable embedded log costs: the same workload on the memory-only and the durable broker, one run.

    python -m jobs.bench.bench_durable [--n 200000] [--rounds 2] [--json out/bench_durable.json]

The embedded broker (Tansu) keeps its log in memory (``dpstream up --ephemeral``, the demo) or, by
default, in an S3-compatible object store on loopback whose objects are files
(:mod:`pipeline.stream.local.object_store`). Per storage, with fresh services each time:

1. **Produce**: ``n`` single-report messages with aiokafka (acks=all), messages/s.
2. **Raw consumption**: an aiokafka consumer reading them back, no processing, messages/s.
3. **Ingest**: one worker process (the production job) applying them, reports/s between 10% and
   90% of the reports accepted (its Prometheus counter).
4. **Batch ingest**: the next step sent by ``ReportProducer`` (columnar batches) while the worker is
   stopped, then read by a restarted worker: reports/s from its first accepted reports to the last.
5. **Close -> release latency** of steps 1..3 (fixed window, cumulative and heavy hitters together):
   close -> every record of the step acknowledged (the releaser's gauge) and -> the whole step read
   back by a consumer; the median over the steps.

The storages alternate (memory, durable, memory, durable, ...) for ``--rounds`` rounds, so a load
change on a shared machine hits both; the ratios durable/memory are taken per round, and the
median of those is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import statistics
import time
from pathlib import Path

import numpy as np
import yaml

from jobs.bench import write_json
from jobs.bench.bench_stream import (
    HORIZON,
    _burst_rate,
    _close,
    _config,
    _ingest_rate,
    _produce,
    _raw_consume,
    _single_messages,
)
from jobs.bench.own_broker import use_own_brokers


def one_storage(
    durable: bool, n: int, partitions: int, out: Path, pov: np.ndarray, item: np.ndarray
) -> dict:
    from pipeline.config import load_config
    from pipeline.stream.ingest.roster import Roster
    from pipeline.stream.kafka.topics import ensure_topics
    from pipeline.stream.local.cluster import LocalCluster
    from pipeline.stream.local.driver import StepDriver
    from pipeline.stream.local.embedded import EmbeddedServices

    out.mkdir(parents=True, exist_ok=True)
    row: dict = {"storage": "durable" if durable else "memory"}
    with EmbeddedServices(data_dir=None, durable_log=durable, broker_log=out / "broker.log") as svc:
        cfg_path = out / "bench.yaml"
        cfg_path.write_text(yaml.safe_dump(_config(n, partitions, svc)))
        deployment = load_config(cfg_path)
        roster = Roster.from_config(deployment.roster)
        names = ensure_topics(svc.broker.bootstrap, deployment)
        msgs = _single_messages(roster, 1, pov[:, 0], item[:, 0])
        row["produce_msgs_per_s"] = n / asyncio.run(
            _produce(svc.broker.bootstrap, names["reports"], msgs)
        )
        del msgs
        row["raw_consume_msgs_per_s"] = n / asyncio.run(
            _raw_consume(svc.broker.bootstrap, names["reports"], n)
        )
        with LocalCluster(
            cfg_path, deployment, workers=1, log_dir=out / "logs", metrics=True
        ) as cluster:
            row["ingest_single_reports_per_s"] = _ingest_rate(
                [cluster.metrics_ports["worker-0"]], 0.0, n
            )
            drv = StepDriver(cluster.broker, deployment, roster, cluster.names, cluster=cluster)
            rport = cluster.metrics_ports["releaser"]
            latencies = [_close(drv, 1, rport)]
            cluster.kill(
                "worker-0", signal.SIGTERM
            )  # step 2 waits in the log while the worker is down
            drv.producer.send_step(2, {"poverty": pov[:, 1], "item": item[:, 1]})
            cluster.spawn("worker", "worker-0")
            try:
                row["ingest_batch_reports_per_s"] = _burst_rate(
                    cluster.metrics_ports["worker-0"], n
                )
            except RuntimeError:  # the whole step in one fetch (small n): no rate to take
                row["ingest_batch_reports_per_s"] = float("nan")
            latencies.append(_close(drv, 2, rport))
            drv.producer.send_step(3, {"poverty": pov[:, 2], "item": item[:, 2]})
            time.sleep(1.0)
            latencies.append(_close(drv, 3, rport))
            drv.shutdown()
        row["close_to_publish_s"] = statistics.median(p for p, _ in latencies)
        row["close_to_read_back_s"] = statistics.median(c for _, c in latencies)
    return row


RATES = (
    "produce_msgs_per_s",
    "raw_consume_msgs_per_s",
    "ingest_single_reports_per_s",
    "ingest_batch_reports_per_s",
)
LATENCIES = ("close_to_publish_s", "close_to_read_back_s")


def main(argv=None) -> dict:
    use_own_brokers("bench_durable")  # never a running `up`'s gate
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--out", default="out/bench_durable")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    pov = (rng.random((args.n, HORIZON)) < 0.12).astype(np.int64)
    item = rng.integers(0, 1_000_000, size=(args.n, HORIZON))
    item[: args.n // 50] = 12345
    rounds = []
    for r in range(args.rounds):
        pair = {}
        for durable in (False, True):
            row = one_storage(
                durable,
                args.n,
                args.partitions,
                Path(args.out) / f"r{r}-{'durable' if durable else 'memory'}",
                pov,
                item,
            )
            print(json.dumps(row), flush=True)
            pair[row["storage"]] = row
        pair["ratio"] = {k: pair["durable"][k] / pair["memory"][k] for k in RATES + LATENCIES}
        rounds.append(pair)
    result = {
        "n": args.n,
        "partitions": args.partitions,
        "rounds": rounds,
        "median_ratio_durable_over_memory": {
            k: statistics.median(p["ratio"][k] for p in rounds) for k in RATES + LATENCIES
        },
    }
    print("durable / memory (median over rounds; rates: <1 is slower, latencies: >1 is slower):")
    for k, v in result["median_ratio_durable_over_memory"].items():
        print(
            f"  {k}: {v:.2f}  (memory {statistics.median(p['memory'][k] for p in rounds):,.3g}, "
            f"durable {statistics.median(p['durable'][k] for p in rounds):,.3g})"
        )
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
