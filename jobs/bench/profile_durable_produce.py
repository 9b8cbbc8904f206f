"""Where a produce request's time goes on the embedded durable log: object store, broker, client.

    python -m jobs.bench.profile_durable_produce [--messages 20000] [--linger-ms 5] [--partitions 1]
        [--max-in-flight N] [--syncs journal,files] [--json out/profile_durable_produce.json]

One librdkafka producer (``confluent_kafka``) sends ``--messages`` small messages (~90 B, one report
each) to a fresh topic on the embedded broker, first memory-only, then durable on the embedded
object store in each ``--syncs`` mode with its request trace on
(:mod:`pipeline.stream.local.store_trace`). From the trace: the object store requests per produce
request (one record batch object per partition and request), the store's own time per request kind
and per write phase, and its share of the produce's wall time; from librdkafka's statistics: produce
requests, messages per request and the round trip per request as the client sees it. What is neither
the store's time nor in flight to it is the broker's (Tansu's) own time and the loopback network.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from jobs.bench import write_json

TOPIC = "profile"


def _kind(method: str, target: str) -> str:
    if "list-type" in target or target.rstrip("/").count("/") <= 1:
        return f"{method} list"
    if target.endswith(".batch"):
        return f"{method} batch"
    if "watermark" in target:
        return f"{method} watermark"
    return f"{method} other"


def _produce(bootstrap: str, messages: int, linger_ms: float, max_in_flight: int | None) -> dict:
    from confluent_kafka import Producer

    stats: list[dict] = []
    config = {
        "bootstrap.servers": bootstrap,
        "linger.ms": linger_ms,
        "enable.idempotence": False,
        "statistics.interval.ms": 500,
        "stats_cb": lambda raw: stats.append(json.loads(raw)),
    }
    if max_in_flight is not None:
        config["max.in.flight.requests.per.connection"] = max_in_flight
    producer = Producer(config)
    value = b'{"user":"u0000000","step":1,"values":{"poverty":0,"item":123456}}' + b" " * 20
    producer.produce(TOPIC, value=value, key=b"warm-up")
    producer.flush(30)
    started = time.monotonic()
    for i in range(messages):
        while True:
            try:
                producer.produce(TOPIC, value=value, key=f"u{i:07d}".encode())
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(600):
        raise RuntimeError("librdkafka did not deliver every message within 600 s")
    ended = time.monotonic()
    time.sleep(0.6)
    producer.poll(0)  # the last statistics
    brokers = (
        [b for b in stats[-1]["brokers"].values() if b.get("nodeid", -1) >= 0] if stats else []
    )
    produce_requests = sum(b["req"].get("Produce", 0) for b in brokers)
    rtt = [b["rtt"]["avg"] / 1e6 for b in brokers if b["rtt"]["cnt"]]
    topic = stats[-1]["topics"].get(TOPIC, {}) if stats else {}
    return {
        "messages": messages,
        "seconds": ended - started,
        "start": started,
        "end": ended,
        "messages_per_s": messages / (ended - started),
        "produce_requests": produce_requests,
        "messages_per_request": topic.get("batchcnt", {}).get("avg"),
        "client_rtt_avg_s": statistics.mean(rtt) if rtt else None,
    }


def _topic(bootstrap: str, partitions: int) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    admin.create_topics([NewTopic(TOPIC, num_partitions=partitions, replication_factor=1)])
    admin.close()


def _trace_summary(lines: list[list[str]], start: float, end: float) -> dict:
    """The store's requests inside the produce's window: counts, time by kind and phase, busy
    share."""
    by_kind: dict[str, list[float]] = collections.defaultdict(list)
    phases: dict[str, list[float]] = collections.defaultdict(list)
    intervals = []
    for fields in lines:
        begun, ended = float(fields[0]), float(fields[1])
        if begun < start or begun > end:
            continue
        by_kind[_kind(fields[2], fields[3])].append(ended - begun)
        intervals.append((begun, ended))
        for phase in fields[5:]:
            name, _, seconds = phase.partition("=")
            phases[name].append(float(seconds))
    busy, last = 0.0, float("-inf")
    for begun, ended in sorted(intervals):  # the union: time at least one request was in the store
        if ended > last:
            busy += ended - max(begun, last)
            last = ended
    return {
        "requests": sum(len(v) for v in by_kind.values()),
        "by_kind": {
            k: {"count": len(v), "mean_ms": 1e3 * statistics.mean(v), "total_s": sum(v)}
            for k, v in sorted(by_kind.items())
        },
        "phases_mean_ms": {k: 1e3 * statistics.mean(v) for k, v in sorted(phases.items())},
        "store_busy_s": busy,
        "store_busy_share": busy / (end - start),
    }


def one(durable: bool, args, sync: str = "journal") -> dict:
    from pipeline.stream.local.embedded import EmbeddedBroker, EmbeddedObjectStore
    from pipeline.stream.local.store_trace import TRACE_ENV

    with tempfile.TemporaryDirectory(prefix="dpstream-profile-") as tmp:
        trace = Path(tmp) / "trace.tsv"
        storage = None
        if durable:
            os.environ[TRACE_ENV] = str(trace)
            try:
                storage = EmbeddedObjectStore(Path(tmp) / "log", sync=sync).start()
            finally:
                del os.environ[TRACE_ENV]
        broker = EmbeddedBroker(storage=storage).start()
        try:
            _topic(broker.bootstrap, args.partitions)
            row = _produce(broker.bootstrap, args.messages, args.linger_ms, args.max_in_flight)
            if durable:
                time.sleep(0.2)
                lines = [line.split("\t") for line in trace.read_text().splitlines()]
                row["store"] = _trace_summary(lines, row["start"], row["end"])
                batches = row["store"]["by_kind"].get("PUT batch", {}).get("count", 0)
                row["store_requests_per_batch_put"] = row["store"]["requests"] / max(batches, 1)
        finally:
            broker.stop()
            if storage is not None:
                storage.stop()
    return row


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument(
        "--linger-ms", type=float, default=5.0, help="librdkafka's linger.ms (its default: 5)"
    )
    ap.add_argument(
        "--max-in-flight",
        type=int,
        default=None,
        help="max.in.flight.requests.per.connection (librdkafka's default: 1,000,000)",
    )
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument(
        "--syncs",
        default="journal,files",
        help="the object store's modes to run, in order (journal: the default; files: each "
        "object and its folder fsync'd, the previous default; off)",
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    syncs = [s for s in args.syncs.split(",") if s]
    if not set(syncs) <= {"journal", "files", "off"}:
        ap.error(f"--syncs: choose from journal, files, off; got {args.syncs!r}")
    result = {"args": vars(args), "memory": one(False, args)}
    for sync in syncs:
        result[f"durable-{sync}"] = one(True, args, sync)
    for name, row in result.items():
        if name.startswith("durable-"):
            store = row["store"]
            row["durable_speed_over_memory"] = result["memory"]["seconds"] / row["seconds"]
            print(
                f"{name}: {row['seconds']:.2f} s ({row['durable_speed_over_memory']:.2f}x memory's "
                f"{result['memory']['seconds']:.2f} s), "
                f"{row['produce_requests']} produce requests, "
                f"store busy {store['store_busy_share']:.0%} of the time; per request kind (ms): "
                + ", ".join(
                    f"{k} {v['count']}x {v['mean_ms']:.1f}" for k, v in store["by_kind"].items()
                )
                + "; phases, per write (cpu: per request) (ms): "
                + ", ".join(f"{k} {v:.1f}" for k, v in store["phases_mean_ms"].items())
            )
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
