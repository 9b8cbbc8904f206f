"""What the embedded broker's mutual-TLS gate costs: the same Kafka traffic with and without it, interleaved.

    python -m jobs.bench.bench_gate [--mb 32] [--message-kb 64] [--rounds 3] [--json out/bench_gate.json]

Two embedded memory brokers run side by side: one on loopback as before, one in its private network behind
the gate (:mod:`pipeline.stream.local.broker_gate`), as ``dpstream up`` runs it. Each round produces the
same messages to both (aiokafka, acks=all) and reads them all back with a raw aiokafka consumer, the two
brokers alternating so that a loaded machine slows both alike; the medians and their ratios are reported
(docs/security.md, "The embedded broker").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time

from jobs.bench import write_json

TOPIC = "bench-gate"


async def _produce(bootstrap: str, security: dict, payloads: list[bytes]) -> float:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=5,
        max_batch_size=1 << 20,
        max_request_size=8 << 20,
        **security,
    )
    await producer.start()
    try:
        began = time.perf_counter()
        await asyncio.gather(*[await producer.send(TOPIC, payload) for payload in payloads])
        return time.perf_counter() - began
    finally:
        await producer.stop()


async def _consume(bootstrap: str, security: dict, start: int, count: int) -> float:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        max_partition_fetch_bytes=8 << 20,
        fetch_max_bytes=32 << 20,
        **security,
    )
    await consumer.start()
    try:
        tp = TopicPartition(TOPIC, 0)
        consumer.assign([tp])
        consumer.seek(tp, start)
        began, seen = time.perf_counter(), 0
        while seen < count:
            for records in (await consumer.getmany(timeout_ms=1000)).values():
                seen += len(records)
        return time.perf_counter() - began
    finally:
        await consumer.stop()


def main(argv: list[str] | None = None) -> dict:
    from pipeline.connections import tls_context
    from pipeline.security import TlsFiles
    from pipeline.stream.local.embedded import EmbeddedServices

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=32, help="megabytes per round")
    ap.add_argument("--message-kb", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    payloads = [
        os.urandom(args.message_kb << 10) for _ in range((args.mb << 10) // args.message_kb)
    ]
    megabytes = len(payloads) * args.message_kb / 1024
    times: dict[str, dict[str, list[float]]] = {
        "direct": {"produce": [], "consume": []},
        "gated": {"produce": [], "consume": []},
    }
    with EmbeddedServices() as direct, EmbeddedServices(isolated=True) as gated:
        assert gated.gate is not None
        tls = gated.gate.tls
        routes = {
            "direct": (direct.broker.bootstrap, {}),
            "gated": (
                gated.broker.bootstrap,
                {
                    "security_protocol": "SSL",
                    "ssl_context": tls_context(
                        TlsFiles(
                            ca_file=str(tls.ca_file),
                            cert_file=str(tls.client_cert),
                            key_file=str(tls.client_key),
                        ),
                        "gate",
                    ),
                },
            ),
        }
        from kafka import KafkaAdminClient
        from kafka.admin import NewTopic

        for bootstrap, security in routes.values():
            admin = KafkaAdminClient(bootstrap_servers=bootstrap, **security)
            admin.create_topics([NewTopic(TOPIC, 1, 1)])
            admin.close()
        for round_ in range(args.rounds):
            for name, (bootstrap, security) in routes.items():
                start = round_ * len(payloads)
                times[name]["produce"].append(asyncio.run(_produce(bootstrap, security, payloads)))
                times[name]["consume"].append(
                    asyncio.run(_consume(bootstrap, security, start, len(payloads)))
                )
    result: dict = {
        "megabytes_per_round": megabytes,
        "message_kb": args.message_kb,
        "rounds": args.rounds,
    }
    for what in ("produce", "consume"):
        rates = {name: megabytes / statistics.median(times[name][what]) for name in times}
        result[f"{what}_mb_per_s"] = rates
        result[f"{what}_gated_over_direct"] = rates["gated"] / rates["direct"]
        print(
            f"{what}: direct {rates['direct']:.1f} MB/s, gated {rates['gated']:.1f} MB/s "
            f"(gated/direct {rates['gated'] / rates['direct']:.2f}; medians of {args.rounds} rounds)",
            flush=True,
        )
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
