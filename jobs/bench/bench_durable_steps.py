"""Time to release on the durable log against the memory-only one, step after step, with plain clients.

    python -m jobs.bench.bench_durable_steps --n 100000 --steps 2 [--kinds kafka-python,librdkafka,batch]
        [--storages memory,durable] [--workers 2] [--json out/bench_durable_steps.json]

Per storage (``memory``: the memory-only broker of ``dpstream up --ephemeral``; ``durable``: the durable
default of ``dpstream up``, its object store journaling every write, with the log retention ``up``
runs; ``durable-files``: the same with each object file and its folder fsync'd instead, the object
store's previous default), one deployment of ``n`` users, and ``--steps`` steps per producer kind, in
order:

* ``kafka-python``: one JSON message per report, ``KafkaProducer`` with its defaults (linger 0), not
  idempotent (docs/streaming.md): it batches only what piles up while a request is in flight;
* ``librdkafka``: one message per report, ``confluent_kafka.Producer`` with its defaults (``linger.ms``
  5, a million requests in flight: a request every 5 ms, however slowly the broker answers);
* ``librdkafka-batched``: the same with the settings docs/streaming.md recommends for the embedded
  durable log (:data:`BATCHED_LIBRDKAFKA`);
* ``batch``: dpstream's ``ReportProducer`` (columnar batches).

A step's *time to release* runs from its first report sent to the step read back from the public
topics (the step is closed as soon as its last report is acknowledged, so the workers' backlog is in
it). The durable log grows by every step's batches; what flat means here is the last step of a kind
taking no longer than its first. The ratio memory/durable of each step's time is the durable default's
speed as a fraction of memory's (≥ 0.7 is the target).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path

import numpy as np
import orjson
import yaml

from jobs.bench import write_json
from jobs.bench.bench_stream import HORIZON, _config
from jobs.bench.own_broker import use_own_brokers

KINDS = ("kafka-python", "librdkafka", "librdkafka-batched", "batch")
STORAGES = {"memory": None, "durable": "on", "durable-files": "files"}  # name -> DPSTREAM_LOG_FSYNC
# a producer of single reports that batches whatever the broker's speed: it waits up to 100 ms to fill
# a request, and with at most 5 requests unanswered the messages sent meanwhile join the next ones
BATCHED_LIBRDKAFKA = {"linger.ms": 100, "max.in.flight.requests.per.connection": 5}


def _messages(roster, step: int, pov: np.ndarray, item: np.ndarray):
    for uid, p, v in zip(roster.ids, pov.tolist(), item.tolist()):
        yield (
            uid.encode(),
            orjson.dumps({"user": uid, "step": step, "values": {"poverty": p, "item": v}}),
        )


def _send_kafka_python(bootstrap: str, topic: str, messages) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap, enable_idempotence=False
    )  # linger 0: its default
    for key, value in messages:
        producer.send(topic, value=value, key=key)
    producer.flush()
    producer.close()


def _send_librdkafka(bootstrap: str, topic: str, messages, settings: dict | None = None) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 5,
            "enable.idempotence": False,
            **(settings or {}),
        }
    )
    for key, value in messages:
        while True:
            try:
                producer.produce(topic, value=value, key=key)
                break
            except BufferError:  # its queue is full: let it send
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("librdkafka did not deliver every report within 120 s")


class _Retention(threading.Thread):
    """What ``dpstream up`` runs beside a durable deployment: a retention round every 5 s."""

    def __init__(self, retention):
        super().__init__(daemon=True)
        self.retention, self.stopped, self.errors = retention, threading.Event(), []

    def run(self) -> None:
        while not self.stopped.wait(5.0):
            try:
                self.retention.round()
            except Exception as err:  # noqa: BLE001 - reported in the result, as up prints it
                self.errors.append(str(err))


def _wait_assigned(log_dir: Path, partitions: int, timeout: float = 120.0) -> None:
    """Until the workers hold every partition and the group has been still for 3 s (a first step must
    not pay for the workers' start)."""
    deadline, last, still_since = time.monotonic() + timeout, -1, time.monotonic()
    while time.monotonic() < deadline:
        lines = sum(
            p.read_text(errors="replace").count("consuming from offset")
            for p in log_dir.glob("worker-*.log")
        )
        if lines != last:
            last, still_since = lines, time.monotonic()
        elif lines >= partitions and time.monotonic() - still_since > 3.0:
            return
        time.sleep(0.2)
    raise TimeoutError(
        f"the workers did not take the {partitions} partitions within {timeout:.0f} s"
    )


def one_storage(
    storage: str,
    n: int,
    steps: int,
    kinds,
    workers: int,
    partitions: int,
    out: Path,
    pov: np.ndarray,
    item: np.ndarray,
) -> dict:
    from pipeline.config import load_config
    from pipeline.stream.ingest.roster import Roster
    from pipeline.stream.kafka.topics import ensure_topics
    from pipeline.stream.local.cluster import LocalCluster
    from pipeline.stream.local.driver import StepDriver
    from pipeline.stream.local.embedded import FSYNC_ENV, EmbeddedServices
    from pipeline.stream.local.retention import LogRetention
    from pipeline.stream.state.store import StateStore

    out.mkdir(parents=True, exist_ok=True)
    row: dict = {"storage": storage, "steps": []}
    durable = STORAGES[storage] is not None
    previous = os.environ.get(FSYNC_ENV)
    os.environ[FSYNC_ENV] = STORAGES[storage] or "on"  # read when the object store is configured
    try:
        services = EmbeddedServices(
            data_dir=None, durable_log=durable, broker_log=out / "broker.log"
        )
    finally:
        if previous is None:
            del os.environ[FSYNC_ENV]
        else:
            os.environ[FSYNC_ENV] = previous
    with services as svc:
        cfg_path = out / "bench.yaml"
        cfg = _config(n, partitions, svc)
        cfg["steps"]["max_ahead"] = HORIZON  # steps are produced back to back
        cfg_path.write_text(yaml.safe_dump(cfg))
        deployment = load_config(cfg_path)
        roster = Roster.from_config(deployment.roster)
        names = ensure_topics(svc.broker.bootstrap, deployment)
        retention = None
        with LocalCluster(
            cfg_path, deployment, workers=workers, log_dir=out / "logs", metrics=True
        ) as cluster:
            if durable:
                assert svc.storage is not None  # durable_log=True starts the object store
                retention = _Retention(
                    LogRetention(
                        svc.storage,
                        StateStore.from_url(svc.redis.url, deployment.name),
                        cluster.names,
                        partitions,
                    )
                )
                retention.start()
            drv = StepDriver(cluster.broker, deployment, roster, cluster.names, cluster=cluster)
            _wait_assigned(out / "logs", partitions)
            step = 0
            for kind in kinds:
                for _ in range(steps):
                    step += 1
                    t = step - 1
                    started = time.perf_counter()
                    if kind == "batch":
                        drv.producer.send_step(
                            step, {"poverty": pov[:, t % HORIZON], "item": item[:, t % HORIZON]}
                        )
                    else:
                        messages = _messages(
                            roster, step, pov[:, t % HORIZON], item[:, t % HORIZON]
                        )
                        if kind == "kafka-python":
                            _send_kafka_python(cluster.broker, names["reports"], messages)
                        else:
                            _send_librdkafka(
                                cluster.broker,
                                names["reports"],
                                messages,
                                BATCHED_LIBRDKAFKA if kind == "librdkafka-batched" else None,
                            )
                    produced = time.perf_counter() - started
                    drv.close(step, timeout=1800)
                    entry = {
                        "step": step,
                        "kind": kind,
                        "produce_s": produced,
                        "time_to_release_s": time.perf_counter() - started,
                    }
                    if durable and svc.storage is not None:
                        root = svc.storage.data_dir
                        entry["stored_batches"] = sum(
                            1
                            for _ in root.rglob(
                                f"topics/{names['reports']}/partitions/*/records/*.batch"
                            )
                        )
                    row["steps"].append(entry)
                    print(json.dumps({"storage": row["storage"], **entry}), flush=True)
            drv.shutdown()
            if retention is not None:
                retention.stopped.set()
                row["retention_deleted"] = retention.retention.deleted
                row["retention_errors"] = retention.errors[:3]
    return row


def main(argv=None) -> dict:
    use_own_brokers("bench_durable_steps")  # never a running `up`'s gate
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="users, each reporting once a step")
    ap.add_argument("--steps", type=int, default=2, help="steps per producer kind")
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument(
        "--storages",
        default="memory,durable",
        help=f"in order, the first the baseline of the ratios; from {', '.join(STORAGES)}",
    )
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--json", default=None)
    ap.add_argument("--out", default="out/bench_durable_steps")
    args = ap.parse_args(argv)
    kinds = [k for k in args.kinds.split(",") if k]
    unknown = set(kinds) - set(KINDS)
    if unknown:
        ap.error(f"--kinds: unknown {sorted(unknown)}; choose from {', '.join(KINDS)}")
    storages = [s for s in args.storages.split(",") if s]
    if set(storages) - set(STORAGES) or len(storages) < 2:
        ap.error(f"--storages: two or more of {', '.join(STORAGES)}; got {args.storages!r}")
    if len(kinds) * args.steps > HORIZON:
        ap.error(f"--steps × kinds must be at most the horizon ({HORIZON})")
    rng = np.random.default_rng(0)
    pov = (rng.random((args.n, HORIZON)) < 0.12).astype(np.int64)
    item = rng.integers(0, 1_000_000, size=(args.n, HORIZON))
    item[: args.n // 50] = 12345
    rows = {
        storage: one_storage(
            storage,
            args.n,
            args.steps,
            kinds,
            args.workers,
            args.partitions,
            Path(args.out) / f"n{args.n}-{storage}",
            pov,
            item,
        )
        for storage in storages
    }
    base = storages[0]
    ratios = {
        storage: [
            {
                "step": b["step"],
                "kind": b["kind"],
                "speed_over_" + base: b["time_to_release_s"] / d["time_to_release_s"],
            }
            for b, d in zip(rows[base]["steps"], rows[storage]["steps"])
        ]
        for storage in storages[1:]
    }
    result = {
        "n": args.n,
        "workers": args.workers,
        "partitions": args.partitions,
        "rows": rows,
        "ratios": ratios,
    }
    print(
        f"n = {args.n:,}: speed / {base}'s speed per step (time to release; ≥ 0.7 is the target):"
    )
    for i, b in enumerate(rows[base]["steps"]):
        line = f"  step {b['step']} {b['kind']:>18}: {base} {b['time_to_release_s']:.1f} s"
        for storage in storages[1:]:
            d = rows[storage]["steps"][i]
            line += (
                f"; {storage} {d['time_to_release_s']:.1f} s "
                f"({ratios[storage][i]['speed_over_' + base]:.2f}, {d.get('stored_batches', 0):,} batches)"
            )
        print(line)
    result["median_ratio_by_kind"] = {
        storage: {
            k: statistics.median([r["speed_over_" + base] for r in rs if r["kind"] == k])
            for k in kinds
            if any(r["kind"] == k for r in rs)
        }
        for storage, rs in ratios.items()
    }
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
