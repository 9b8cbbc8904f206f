"""Ingest throughput when the producer does not partition by murmur2 (reports forwarded to their
owner through ``repartition``) against a matched producer, in the same run.

    python -m jobs.bench.bench_repartition [--n 200000] [--partitions 2] [--rounds 2] [--json out/bench.json]

On the embedded broker and Redis, one worker process (the production job) owning every partition.
Each step's single-report messages (keyed by user id) are produced while the worker is stopped, with
the same aiokafka producer and an explicit partition per message:

* ``matched``: murmur2(user id) mod P — what the Java client, kafka-python and aiokafka's default
  partitioner do; every report lands on its owner (the baseline, measured first and last);
* ``crc32``: CRC32(user id) mod P — librdkafka's default ``consistent_random`` (confluent-kafka,
  kcat, the Go/.NET/Node clients); about (P−1)/P of the reports are forwarded;
* ``random``: a uniformly random partition (null keys, ``partitioner: random``).

The worker is then started (restoring its checkpoint) and the rate is taken from the first reports
it accepted to the last of the step's n reports *applied by their owner* (the worker's ``accepted``
counter, which counts a forwarded report when its owner applies it, so the last forwards' round
trip counts), so start-up and group join are excluded. The counter moves once per fetch (up to
50,000 records): at n = 2·10⁵ a step is a handful of fetches and half a second, so read the rates
with that grain; ``--n 1000000`` gives steadier ones. Each step is
then closed and released, and checked: n reports accepted, none dead-lettered.

The steps go matched, crc32, random, matched, crc32, random, ..., matched (``--rounds`` rounds): each
mismatched step is compared with the matched steps just before and after it (the machine's speed
drifts between steps when it is shared), and a producer's ratio is the mean over rounds. Beside
the rate, the job reads the CPU seconds the worker and the broker spent in the same window
(/proc): CPU per report moves far less than the rate with the load of other processes, and its
ratio says what forwarding costs the machine (the broker stores and serves every forward).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import zlib
from pathlib import Path

import numpy as np
import orjson
import yaml

from jobs.bench import write_json
from jobs.bench.bench_stream import _accepted, _gauge, _samples
from jobs.bench.own_broker import use_own_brokers

PRODUCERS = ("crc32", "random")


def _config(n: int, partitions: int, horizon: int, services) -> dict:
    return {
        "name": "bench-repartition",
        "broker": services.broker.bootstrap,
        "redis": services.redis.url,
        "roster": {"size": n},
        "horizon": horizon,
        "topics": {"partitions": partitions},
        "attributes": {"poverty": {"type": "binary"}},
        "budget": {"rho": 0.5},
        "random": {"kind": "seeded", "seed": 1},
        "releases": [
            {
                "name": "fw",
                "type": "fixed_window",
                "attribute": "poverty",
                "window": 3,
                "share": 0.5,
            },
            {"name": "cu", "type": "cumulative", "attribute": "poverty", "share": 0.5},
        ],
    }


def _cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far (/proc/<pid>/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rate_and_cpu(port: int, pids: dict[str, int], expected: int) -> tuple[float, dict[str, float]]:
    """Reports/s from the first reports the freshly started worker accepted to the last of
    ``expected`` (its start-up and group join left out, the first fetch's reports not counted), and
    the CPU µs per report each process in ``pids`` spent meanwhile: unlike the rate, it moves little
    with the load other processes put on the machine."""
    first = None
    for now, got in _samples([port], 0.005):
        if first is None and got > 0:
            first = (now, got, {k: _cpu_seconds(p) for k, p in pids.items()})
        if got >= expected:
            assert first is not None  # set once got > 0
            done = got - first[1]
            if done <= 0:
                raise RuntimeError(
                    "the whole step was accepted between two samples: rate not measurable"
                )
            return done / (now - first[0]), {
                k: (_cpu_seconds(p) - first[2][k]) / done * 1e6 for k, p in pids.items()
            }
    raise TimeoutError("ingest did not finish")  # _samples raises first


def placements(roster, partitions: int, seed: int) -> dict[str, np.ndarray]:
    """Partition of every user's report under each producer."""
    keys = [uid.encode() for uid in roster.ids]
    return {
        "matched": roster.owners(partitions).astype(np.int64),
        "crc32": np.fromiter(
            (zlib.crc32(k) % partitions for k in keys), dtype=np.int64, count=len(keys)
        ),
        "random": np.random.default_rng(seed).integers(0, partitions, size=len(keys)),
    }


async def _produce(
    bootstrap: str, topic: str, roster, step: int, pov: np.ndarray, where: np.ndarray
) -> None:
    from aiokafka import AIOKafkaProducer

    from pipeline.connections import kafka_security

    prod = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        **kafka_security(),
        linger_ms=20,
        max_batch_size=1 << 20,
        max_request_size=8 << 20,
    )
    await prod.start()
    try:
        ids, values, parts = roster.ids, pov.tolist(), where.tolist()
        for i in range(0, len(ids), 10_000):
            batch = [
                await prod.send(
                    topic,
                    key=ids[j].encode(),
                    partition=parts[j],
                    value=orjson.dumps(
                        {"user": ids[j], "step": step, "values": {"poverty": values[j]}}
                    ),
                )
                for j in range(i, min(i + 10_000, len(ids)))
            ]
            await asyncio.gather(*batch)
    finally:
        await prod.stop()


def main(argv=None) -> dict:
    use_own_brokers("bench_repartition")  # never a running `up`'s gate
    from pipeline.config import load_config
    from pipeline.stream.ingest.roster import Roster
    from pipeline.stream.local.cluster import LocalCluster
    from pipeline.stream.local.driver import StepDriver
    from pipeline.stream.local.embedded import EmbeddedServices

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=2)
    ap.add_argument(
        "--rounds", type=int, default=2, help="rounds of matched, crc32, random (then matched)"
    )
    ap.add_argument("--json", default=None)
    ap.add_argument("--out", default="out/bench_repartition")
    args = ap.parse_args(argv)
    n, P = args.n, args.partitions
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    order = [p for _ in range(args.rounds) for p in ("matched", *PRODUCERS)] + ["matched"]
    horizon = len(order)
    pov = (np.random.default_rng(0).random((n, horizon)) < 0.12).astype(np.int64)
    result: dict = {"n": n, "partitions": P, "rounds": args.rounds, "steps": []}
    with EmbeddedServices(broker_log=out / "broker.log") as svc:
        cfg_path = out / "bench.yaml"
        cfg_path.write_text(yaml.safe_dump(_config(n, P, horizon, svc)))
        deployment = load_config(cfg_path)
        roster = Roster.from_config(deployment.roster)
        where = placements(roster, P, seed=1)
        with LocalCluster(
            cfg_path, deployment, workers=0, log_dir=out / "logs", metrics=True
        ) as cluster:
            drv = StepDriver(cluster.broker, deployment, roster, cluster.names, cluster=cluster)
            for step, producer in enumerate(order, start=1):
                misplaced = float((where[producer] != where["matched"]).mean())
                asyncio.run(
                    _produce(
                        cluster.broker,
                        cluster.names["reports"],
                        roster,
                        step,
                        pov[:, step - 1],
                        where[producer],
                    )
                )
                cluster.spawn("worker", "worker-0")
                port = cluster.metrics_ports["worker-0"]
                assert svc.broker.pid is not None  # started with the services
                rate, cpu = _rate_and_cpu(
                    port, {"worker": cluster.procs["worker-0"].pid, "broker": svc.broker.pid}, n
                )
                drv.close(step)
                dead = _gauge(port, 'dpstream_reports_total{status="rejected"}')
                forwarded = _gauge(port, 'dpstream_reports_total{status="forwarded"}')
                if _accepted(port) != n or dead:
                    raise RuntimeError(
                        f"step {step} ({producer}): {_accepted(port):,.0f} accepted, {dead:,.0f} "
                        f"rejected of {n:,}"
                    )
                cluster.kill(
                    "worker-0", signal.SIGTERM
                )  # the step is checkpointed; the next waits in the log
                cluster.wait_exit("worker-0")
                row = {
                    "step": step,
                    "producer": producer,
                    "misplaced": misplaced,
                    "forwarded": forwarded,
                    "reports_per_s": rate,
                    "cpu_us_per_report": cpu,
                }
                result["steps"].append(row)
                print(
                    f"step {step} {producer:>8}: {misplaced:.1%} on the wrong partition, {forwarded:,.0f} forwarded, "
                    f"{rate:,.0f} reports/s; CPU per report: worker {cpu['worker']:.2f} µs, broker "
                    f"{cpu['broker']:.2f} µs",
                    flush=True,
                )
            drv.shutdown()
    rates = [r["reports_per_s"] for r in result["steps"]]
    cpus = [sum(r["cpu_us_per_report"].values()) for r in result["steps"]]  # worker + broker
    result["ratio_to_matched"], result["cpu_ratio_to_matched"], result["rounds_detail"] = {}, {}, []
    for k in range(
        args.rounds
    ):  # round k: matched at 3k, the producers after it, matched again at 3k + 3
        before, after = rates[3 * k], rates[3 * k + 3]
        ratios = {p: rates[3 * k + 1 + j] / ((before + after) / 2) for j, p in enumerate(PRODUCERS)}
        cpu_ratios = {
            p: (cpus[3 * k] + cpus[3 * k + 3]) / 2 / cpus[3 * k + 1 + j]
            for j, p in enumerate(PRODUCERS)
        }
        result["rounds_detail"].append(
            {
                "matched_before": before,
                "matched_after": after,
                "ratio": ratios,
                "cpu_ratio": cpu_ratios,
            }
        )
        print(
            f"round {k + 1}: matched {before:,.0f} reports/s before, {after:,.0f} after; of their mean: "
            + ", ".join(f"{p} {r:.2f}x" for p, r in ratios.items())
            + "; matched CPU per report (worker + broker) "
            "over theirs: " + ", ".join(f"{p} {r:.2f}x" for p, r in cpu_ratios.items()),
            flush=True,
        )
    for p in PRODUCERS:
        result["ratio_to_matched"][p] = float(
            np.mean([d["ratio"][p] for d in result["rounds_detail"]])
        )
        result["cpu_ratio_to_matched"][p] = float(
            np.mean([d["cpu_ratio"][p] for d in result["rounds_detail"]])
        )
    print(
        "ratio to the matched producer (mean over rounds; target >= 0.9x): reports/s "
        + ", ".join(f"{p} {r:.2f}x" for p, r in result["ratio_to_matched"].items())
        + "; per CPU second of worker and broker "
        + ", ".join(f"{p} {r:.2f}x" for p, r in result["cpu_ratio_to_matched"].items()),
        flush=True,
    )
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
