"""Stream benchmark: ingest throughput against raw consumption, release latency, memory, releaser cost.

    python -m jobs.bench.bench_stream [--n 1000000] [--partitions 4] [--json out/bench_stream.json] [--quick]
                                      [--gated]

Measured in one run on the embedded broker and Redis:

1. **Raw consumption** (the broker-side limit on this machine): an aiokafka consumer reading the
   step's single-report messages with ``getmany`` from all partitions, no processing.
2. **Ingest, single-report messages**: one worker process (aiokafka bulk consumer, the production
   job) applying the same messages;
   the rate is taken between 10% and 90% of the reports accepted (read from the worker's
   Prometheus counter), so start-up and group join are excluded.
3. **Ingest, batch messages** (columnar, 5,000 reports per message), next step: produced while the
   worker is stopped, then the worker is restarted (restoring its checkpoints) and the rate is taken
   from its first accepted reports to the last (a whole step can arrive in a few fetches). Before
   the worker starts, a raw aiokafka consumer reads the same batch messages (their offset range)
   with no processing: the broker-side ceiling for batch messages, as (1) is for single ones.
4. **Release latency** per step, for a fixed-window (k = 3), a cumulative (T = 12) and a
   heavy-hitter (tct, |X| = 10^6) release together: close command -> every record of the step
   acknowledged by the broker (the releaser's curator-side ``dpstream_close_to_publish_seconds``;
   the public records are stamped with the close time, so their timestamps cannot measure it), and
   -> the whole step (manifests and all synthetic chunks) read back by a consumer.
5. **Ingest, single-report messages, two worker processes** (next step, produced while the workers
   are stopped): scale-out on this one machine, the two workers sharing its two cores with the
   broker; the rate is the sum of both workers' counters between 10% and 90% of the reports.
6. **Memory per user** of worker state: the exact array bytes of the partitions' checkpoints after
   step 4, the kept partials beside them at that moment, and the state right after a close in
   steady state: the arrays and the last closed step's partial (step 4's, read off
   ``step-partials``), kept until its heavy-hitter feedback proves the step released; and the
   worker's resident set size after ingest.
7. **Releaser cost** (in process, no Kafka): one release step against m, T, 2^k and |X|.
8. **Parser throughput** (in process, one core): single-report messages, row batches and columnar
   batches of the same reports.

``--gated``: the broker as ``dpstream up`` runs it, in its private network behind the mutual-TLS gate
(:mod:`pipeline.stream.local.broker_gate`): every Kafka byte of (1)-(6) crosses the gate. Run once with
and once without to read its cost (docs/security.md, "The embedded broker").
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import yaml

from jobs.bench import write_json
from jobs.bench.own_broker import use_own_brokers
from pipeline.connections import kafka_security

HORIZON = 12
DOMAIN = 1_000_000


def _config(n: int, partitions: int, services) -> dict:
    return {
        "name": "bench",
        "broker": services.broker.bootstrap,
        "redis": services.redis.url,
        "roster": {"size": n},
        "horizon": HORIZON,
        "topics": {"partitions": partitions},
        "attributes": {"poverty": {"type": "binary"}, "item": {"type": "hashed", "size": DOMAIN}},
        "budget": {"rho": 0.01, "epsilon": 1.0, "delta": 1e-6},
        "random": {"kind": "seeded", "seed": 1},
        "steps": {"max_ahead": 3},
        "releases": [
            {
                "name": "fw",
                "type": "fixed_window",
                "attribute": "poverty",
                "window": 3,
                "share": 0.5,
            },
            {"name": "cu", "type": "cumulative", "attribute": "poverty", "share": 0.5},
            {
                "name": "hh",
                "type": "heavy_hitters",
                "attribute": "item",
                "method": "tct",
                "k": 3,
                "share": 1.0,
            },
        ],
    }


_CHUNK = 10_000  # messages built and in flight at a time: the job's memory does not grow with n


def _single_messages(roster, step: int, pov: np.ndarray, item: np.ndarray):
    """The step's single-report messages, ``_CHUNK`` (key, value) pairs at a time."""
    for i in range(0, roster.n, _CHUNK):
        yield [
            (
                uid.encode(),
                orjson.dumps({"user": uid, "step": step, "values": {"poverty": p, "item": v}}),
            )
            for uid, p, v in zip(
                roster.ids[i : i + _CHUNK],
                pov[i : i + _CHUNK].tolist(),
                item[i : i + _CHUNK].tolist(),
            )
        ]


async def _produce(bootstrap: str, topic: str, chunks) -> float:
    """Send chunks of (key, value) messages, each chunk acknowledged before the next is built."""
    from aiokafka import AIOKafkaProducer

    prod = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        **kafka_security(),
        linger_ms=20,
        max_batch_size=1 << 20,
        max_request_size=8 << 20,
    )
    await prod.start()
    started = time.perf_counter()
    try:
        for chunk in chunks:
            batch = [await prod.send(topic, value=v, key=k) for k, v in chunk]
            await asyncio.gather(*batch)
    finally:
        await prod.stop()
    return time.perf_counter() - started


async def _end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap, **kafka_security(), enable_auto_commit=False
    )
    await consumer.start()
    try:
        tps = [
            TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or {0})
        ]
        return {tp.partition: off for tp, off in (await consumer.end_offsets(tps)).items()}
    finally:
        await consumer.stop()


async def _raw_consume(
    bootstrap: str, topic: str, expected: int, start: dict[int, int] | None = None
) -> float:
    """Seconds an aiokafka consumer takes to read ``expected`` records with ``getmany``, no
    processing, from the beginning of each partition or from the offsets ``start``: the broker-side
    ceiling for the messages that lie there."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        **kafka_security(),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=8 << 20,
        fetch_max_bytes=64 << 20,
    )
    await consumer.start()
    try:
        tps = [
            TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or {0})
        ]
        consumer.assign(tps)
        if start is None:
            await consumer.seek_to_beginning(*tps)
        else:
            for tp in tps:
                consumer.seek(tp, start.get(tp.partition, 0))
        got, started = 0, time.perf_counter()
        while got < expected:
            batch = await consumer.getmany(timeout_ms=500, max_records=100_000)
            got += sum(len(msgs) for msgs in batch.values())
        return time.perf_counter() - started
    finally:
        await consumer.stop()


def _gauge(port: int, series: str) -> float:
    """The value of one series (name with its labels, as exposed) on a process's /metrics; 0 if absent."""
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    m = re.search(rf"^{re.escape(series)} ([0-9.e+-]+)$", body, re.M)
    return float(m.group(1)) if m else 0.0


def _accepted(port: int) -> float:
    return _gauge(port, 'dpstream_reports_total{status="accepted"}')


def _samples(ports: list[int], interval: float, timeout: float = 600):
    """(time, reports accepted so far) summed over the workers' counters every ``interval`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            got = sum(_accepted(port) for port in ports)
        except OSError:
            got = 0.0
        yield time.perf_counter(), got
        time.sleep(interval)
    raise TimeoutError("ingest did not finish")


def _ingest_rate(ports: list[int], start_count: float, expected: int) -> float:
    """Reports/s between 10% and 90% of ``expected`` newly accepted reports (summed over ``ports``)."""
    lo, hi = start_count + 0.1 * expected, start_count + 0.9 * expected
    t_lo = None
    for now, got in _samples(ports, 0.02):
        if t_lo is None and got >= lo:
            t_lo = now
        if got >= hi:
            assert t_lo is not None  # got passed lo first
            return 0.8 * expected / max(now - t_lo, 1e-9)
    raise TimeoutError("ingest did not finish")  # _samples raises first


def _burst_rate(port: int, expected: int) -> float:
    """Reports/s from the first reports a freshly started worker accepted to the last of ``expected``
    (the first fetch's reports are left out of the count, so the rate is not inflated)."""
    first = None
    for now, got in _samples([port], 0.005):
        if first is None and got > 0:
            first = (now, got)
        if got >= expected:
            assert first is not None  # set once got > 0
            if got <= first[1]:
                raise RuntimeError(
                    "the whole step was accepted between two samples: rate not measurable"
                )
            return (got - first[1]) / (now - first[0])
    raise TimeoutError("ingest did not finish")  # _samples raises first


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def releaser_cost(quick: bool) -> list[dict]:
    """One release step of each mechanism, in process, against its size parameter."""
    from pipeline.monitors import ShiftingHeavyHitters
    from pipeline.synth.cumulative import CumulativeSynthesizer
    from pipeline.synth.fixed_window import FixedWindowSynthesizer

    rows = []

    def timed(fn, reps=3):
        best = float("inf")
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t)
        return best

    for m in [10_000, 100_000] if quick else [10_000, 100_000, 1_000_000]:
        for k in (3, 6, 9):
            s = FixedWindowSynthesizer(HORIZON, k, 1.0, seed=1, n=m)
            rng = np.random.default_rng(0)
            counts = rng.multinomial(m, np.full(2**k, 2.0**-k))
            s.release_counts(counts)  # step k: builds the m records
            counts2 = rng.multinomial(m, np.full(2**k, 2.0**-k))
            rows.append(
                {
                    "mechanism": "fixed_window",
                    "m": m,
                    "bins": 2**k,
                    "seconds": timed(lambda: _fw_step(s, counts2), reps=1),
                }
            )
    for horizon in (12, 120) if quick else (12, 120, 365):
        cs = CumulativeSynthesizer(horizon, 1.0, seed=1, n=100_000)
        z = np.zeros(horizon + 1, dtype=np.int64)
        z[1] = 30_000
        rows.append(
            {
                "mechanism": "cumulative",
                "m": 100_000,
                "T": horizon,
                "seconds": timed(lambda: cs.release_counts(z), reps=1),
            }
        )
    for domain in (10**4, 10**6, 2**32):
        hh = ShiftingHeavyHitters(
            domain, 1.0, 1e-6, 3, 10_000, method="tct", seed=1, neighbours="replace"
        )
        support = np.unique(np.random.default_rng(1).integers(0, domain, 200_000))
        counts = np.ones(support.size, dtype=np.int64)
        rows.append(
            {
                "mechanism": "heavy_hitters(tct)",
                "domain": domain,
                "support": int(support.size),
                "seconds": timed(lambda: hh.release_histogram(support, counts)),
            }
        )
    return rows


def parser_throughput(n: int = 200_000) -> dict[str, float]:
    """Reports/s parsed and validated on one core, per message format (same reports)."""
    from pipeline.config import parse_config
    from pipeline.stream.ingest.reports import ReportParser
    from pipeline.stream.ingest.roster import Roster

    deployment = parse_config(
        {
            "name": "p",
            "roster": {"size": n},
            "horizon": HORIZON,
            "attributes": {
                "poverty": {"type": "binary"},
                "item": {"type": "hashed", "size": DOMAIN},
            },
            "budget": {"rho": 1.0},
            "releases": [
                {
                    "name": "fw",
                    "type": "fixed_window",
                    "attribute": "poverty",
                    "window": 3,
                    "share": 1.0,
                }
            ],
        }
    )
    parser = ReportParser(Roster.from_config(deployment.roster), deployment.attributes, HORIZON)
    reps: list[dict[str, Any]] = [
        {"user": f"u{i}", "step": 1, "values": {"poverty": i % 2, "item": i % 1000}}
        for i in range(n)
    ]
    formats = {
        "single": [orjson.dumps(r) for r in reps],
        "row_batch": [orjson.dumps({"reports": reps[j : j + 5000]}) for j in range(0, n, 5000)],
        "columnar_batch": [
            orjson.dumps(
                {
                    "columns": {
                        "user": [r["user"] for r in reps[j : j + 5000]],
                        "step": 1,
                        "poverty": [r["values"]["poverty"] for r in reps[j : j + 5000]],
                        "item": [r["values"]["item"] for r in reps[j : j + 5000]],
                    }
                }
            )
            for j in range(0, n, 5000)
        ],
    }
    out = {}
    for name, messages in formats.items():
        best = min(_timed(lambda: parser.parse(messages)) for _ in range(3))
        out[name] = n / best
    return out


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def _fw_step(s, counts):
    if s.t < s.horizon:
        s.release_counts(counts)


def main(argv=None) -> dict:
    use_own_brokers("bench_stream")  # never a running `up`'s gate
    from pipeline.config import load_config
    from pipeline.stream.ingest.roster import Roster
    from pipeline.stream.kafka.topics import ensure_topics
    from pipeline.stream.local.cluster import LocalCluster
    from pipeline.stream.local.driver import StepDriver
    from pipeline.stream.local.embedded import EmbeddedServices

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="n = 100,000 and a smaller releaser sweep")
    ap.add_argument("--json", default=None)
    ap.add_argument("--out", default="out/bench_stream")
    ap.add_argument(
        "--gated",
        action="store_true",
        help="the broker behind its mutual-TLS gate, as `dpstream up`",
    )
    args = ap.parse_args(argv)
    n = 100_000 if args.quick else args.n
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {"n": n, "partitions": args.partitions, "gated": args.gated}
    rng = np.random.default_rng(0)
    pov = (rng.random((n, HORIZON)) < 0.12).astype(np.int8)
    item = rng.integers(0, DOMAIN, size=(n, HORIZON)).astype(
        np.int32
    )  # narrow: 60 B per user at n = 10^7
    item[: n // 50] = 12345  # one heavy element held by 2% of users

    with EmbeddedServices(broker_log=out / "broker.log", isolated=args.gated) as svc:
        if (
            svc.gate is not None
        ):  # this process's clients and the workers it starts: through the gate
            from pipeline.stream.local.broker_tls import BROKER_TLS_ENV

            os.environ[BROKER_TLS_ENV] = str(svc.gate.tls.directory)
        cfg_path = out / "bench.yaml"
        cfg_path.write_text(yaml.safe_dump(_config(n, args.partitions, svc)))
        deployment = load_config(cfg_path)
        roster = Roster.from_config(deployment.roster)
        names = ensure_topics(svc.broker.bootstrap, deployment)
        print(
            f"n={n:,} users, {args.partitions} partitions; producing step 1 as single-report messages ...",
            flush=True,
        )
        msgs = _single_messages(roster, 1, pov[:, 0], item[:, 0])
        result["produce_single_s"] = asyncio.run(
            _produce(svc.broker.bootstrap, names["reports"], msgs)
        )
        raw_s = asyncio.run(_raw_consume(svc.broker.bootstrap, names["reports"], n))
        result["raw_consume_msgs_per_s"] = n / raw_s
        print(f"raw aiokafka consumption: {n / raw_s:,.0f} msgs/s", flush=True)

        with LocalCluster(
            cfg_path, deployment, workers=1, log_dir=out / "logs", metrics=True
        ) as cluster:
            port = cluster.metrics_ports["worker-0"]
            rate = _ingest_rate([port], 0.0, n)
            result["ingest_single_reports_per_s"] = rate
            result["single_vs_raw"] = rate / result["raw_consume_msgs_per_s"]
            print(
                f"ingest, single-report messages: {rate:,.0f} reports/s ({rate / result['raw_consume_msgs_per_s']:.1%} of raw)",
                flush=True,
            )
            drv = StepDriver(cluster.broker, deployment, roster, cluster.names, cluster=cluster)
            rport = cluster.metrics_ports["releaser"]
            latencies = {1: _close(drv, 1, rport)}
            cluster.kill(
                "worker-0", signal.SIGTERM
            )  # step 1 is checkpointed; step 2 waits in the log
            before_step = asyncio.run(_end_offsets(svc.broker.bootstrap, names["reports"]))
            drv.producer.send_step(2, {"poverty": pov[:, 1], "item": item[:, 1]})
            after_step = asyncio.run(_end_offsets(svc.broker.bootstrap, names["reports"]))
            sent = sum(after_step[p] - before_step.get(p, 0) for p in after_step)
            raw_b = n / asyncio.run(
                _raw_consume(svc.broker.bootstrap, names["reports"], sent, start=before_step)
            )
            result["raw_consume_batch_reports_per_s"] = raw_b
            print(
                f"raw aiokafka consumption of the batch messages: {raw_b:,.0f} reports/s",
                flush=True,
            )
            cluster.spawn("worker", "worker-0")
            port = cluster.metrics_ports["worker-0"]
            rate_b = _burst_rate(port, n)
            result["ingest_batch_reports_per_s"] = rate_b
            result["batch_vs_raw"] = rate_b / raw_b
            print(
                f"ingest, batch messages: {rate_b:,.0f} reports/s ({rate_b / raw_b:.1%} of their raw consumption)",
                flush=True,
            )
            latencies[2] = _close(drv, 2, rport)
            for t in (3, 4):
                before = _accepted(port)
                drv.producer.send_step(t, {"poverty": pov[:, t - 1], "item": item[:, t - 1]})
                while (
                    _accepted(port) < before + n
                ):  # latency is measured from a fully ingested step
                    time.sleep(0.05)
                latencies[t] = _close(drv, t, rport)
            result["release_latency_s"] = latencies
            print(
                "release latency, close -> manifests / whole step read back: "
                + ", ".join(f"t={t}: {m:.2f} / {c:.2f} s" for t, (m, c) in latencies.items()),
                flush=True,
            )
            result["latency_breakdown_s"] = latency_breakdown(out / "logs", latencies)
            for t, row in result["latency_breakdown_s"].items():  # the reading side's own share
                row["read_back"] = latencies[t][1] - latencies[t][0]
            for t, row in result["latency_breakdown_s"].items():
                print(
                    f"  step {t}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()) + " s",
                    flush=True,
                )
            result["worker_rss_mb"] = _rss_mb(cluster.procs["worker-0"].pid)
            from pipeline.serialization import loads_state
            from pipeline.stream.state.store import StateStore

            store = StateStore.from_url(svc.redis.url, deployment.name)
            state_bytes = kept_bytes = 0
            for p in range(args.partitions):
                st = loads_state(store.load_checkpoint(p))
                state_bytes += sum(a.nbytes for a in _arrays(st))
                kept_bytes += (
                    sum(map(len, store.load_kept_partials(p, range(1, HORIZON + 1)).values()))
                    if hasattr(store, "load_kept_partials")
                    else 0
                )  # an earlier tree keeps them in the state
            partial = asyncio.run(_partial_bytes(svc.broker.bootstrap, names["step-partials"], 4))
            result.update(
                state_bytes_per_user=state_bytes / n,
                kept_partials_bytes_per_user=kept_bytes / n,
                state_after_close_bytes_per_user=(state_bytes + partial) / n,
                partial_bytes_per_user_per_step=partial / n,
            )
            print(
                f"worker state: {state_bytes / n:.1f} bytes/user (kept partials beside it now: {kept_bytes / n:.1f} "
                f"bytes/user; right after a close, with the closed step's partial kept until its feedback: "
                f"{(state_bytes + partial) / n:.1f}; with 8 steps' partials kept, as without a feedback release: "
                f"{(state_bytes + 8 * partial) / n:.1f}); worker RSS {result['worker_rss_mb']:.0f} MB",
                flush=True,
            )
            rate_2 = _two_worker_rate(
                cluster, svc.broker.bootstrap, names["reports"], roster, pov[:, 4], item[:, 4], n
            )
            result["ingest_single_two_workers_reports_per_s"] = rate_2
            print(
                f"ingest, single-report messages, two workers: {rate_2:,.0f} reports/s "
                f"({rate_2 / result['raw_consume_msgs_per_s']:.1%} of raw)",
                flush=True,
            )
            drv.shutdown()
    result["parser_reports_per_s"] = parser_throughput()
    print(
        "parser (one core): "
        + ", ".join(f"{k} {v:,.0f} reports/s" for k, v in result["parser_reports_per_s"].items())
    )
    result["releaser_cost"] = releaser_cost(args.quick)
    for row in result["releaser_cost"]:
        print(
            "releaser step:",
            {k: v for k, v in row.items() if k != "seconds"},
            f"{row['seconds'] * 1000:.1f} ms",
        )
    write_json(args.json, result)
    return result


async def _partial_bytes(bootstrap: str, topic: str, step: int) -> int:
    """Bytes of ``step``'s partial messages, every partition's (each chunk once): what a worker keeps of
    the step in its checkpoint until the step's feedback proves it released."""
    from aiokafka import AIOKafkaConsumer, TopicPartition

    consumer = AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        **kafka_security(),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_partition_fetch_bytes=8 << 20,
    )
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        end = (await consumer.end_offsets([tp]))[tp]
        chunks: dict[bytes, int] = {}
        while await consumer.position(tp) < end:
            for msgs in (await consumer.getmany(timeout_ms=500)).values():
                chunks.update(
                    (m.key, len(m.value)) for m in msgs if m.key.startswith(f"{step}:".encode())
                )
        return sum(chunks.values())
    finally:
        await consumer.stop()


def _two_worker_rate(
    cluster, bootstrap: str, topic: str, roster, pov: np.ndarray, item: np.ndarray, n: int
) -> float:
    """Step 5 as single-report messages, produced while the worker is stopped, then ingested by two."""
    cluster.kill("worker-0", signal.SIGTERM)
    cluster.wait_exit("worker-0")
    asyncio.run(_produce(bootstrap, topic, _single_messages(roster, 5, pov, item)))
    for name in ("worker-0", "worker-1"):
        cluster.spawn("worker", name)
    ports = [cluster.metrics_ports[name] for name in ("worker-0", "worker-1")]
    rate = _ingest_rate(ports, 0.0, n)
    settled, last = None, -1.0
    for now, got in _samples(
        ports, 0.2
    ):  # a rebalance after the first worker started would replay reports
        if got != last:
            settled, last = now, got
        elif now - settled > 2.0:
            break
    if last != n:
        raise RuntimeError(
            f"two workers accepted {last:,.0f} reports for {n:,} users: a rebalance replayed "
            "reports (one worker started consuming before the other joined); rate not measurable"
        )
    return rate


def _close(drv, step: int, releaser_port: int) -> tuple[float, float]:
    """(close -> every record of the step published, close -> the whole step read back), seconds.

    "Published" is the releaser's curator-side gauge ``dpstream_close_to_publish_seconds``: from the
    close command's record timestamp to the broker's acknowledgement of the step's last record, both
    on this machine's clock, so the reading side's own speed does not count. (The public records
    themselves carry the close time as their timestamp, so they cannot measure it.) "Read back" is
    wall time until this consumer holds the whole step."""
    complete = drv.close(step)
    deadline = time.monotonic() + 30
    while _gauge(releaser_port, "dpstream_close_to_publish_step") != step:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the releaser did not report step {step}'s publish latency")
        time.sleep(0.02)
    return _gauge(releaser_port, "dpstream_close_to_publish_seconds"), complete


_LOG_LINE = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] \[\d+\] \[\w+\] [\w.]+: (.*)$")


def latency_breakdown(log_dir: Path, steps) -> dict[int, dict[str, float]]:
    """Where each step's close -> publish time went, read off the jobs' logs (seconds): close command
    -> markers written, markers -> the last partition's partial acknowledged by its worker, -> all
    partials at the releaser, then the releaser's own split (mechanisms, Redis commit, publish)."""
    from datetime import datetime

    def events(path: Path):
        if not path.exists():
            return
        for line in path.read_text(errors="replace").splitlines():
            m = _LOG_LINE.match(line)
            if m:
                yield datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp(), m.group(2)

    rel = list(events(log_dir / "releaser.log"))
    workers = [e for path in sorted(log_dir.glob("worker-*.log")) for e in events(path)]
    out = {}
    for step in steps:

        def first(evs, pattern):
            return next((t for t, msg in evs if re.fullmatch(pattern, msg)), None)

        cmd = first(rel, rf"close command for step {step}")
        markers = first(rel, rf"close markers for step {step} written to \d+ partitions")
        closed = [t for t, msg in workers if re.match(rf"partition \d+ closed step {step}:", msg)]
        complete = first(rel, rf"partials of step {step} complete")
        released = next(
            ((t, msg) for t, msg in rel if msg.startswith(f"released step {step} ")), None
        )
        if None in (cmd, markers, complete) or released is None:
            continue
        row = {
            "markers": markers - cmd,
            "partitions_closed": (max(closed) - markers) if closed else float("nan"),
            "partials_at_releaser": complete - markers,
        }
        split = re.search(
            r"mechanisms ([\d.]+) s, Redis commit ([\d.]+) s, publish ([\d.]+) s", released[1]
        )
        if split:
            row.update(
                mechanisms=float(split.group(1)),
                redis_commit=float(split.group(2)),
                publish=float(split.group(3)),
            )
        row["total_logged"] = released[0] - cmd
        out[step] = row
    return out


def _arrays(obj):
    if isinstance(obj, np.ndarray):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from _arrays(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _arrays(v)


if __name__ == "__main__":
    main()
