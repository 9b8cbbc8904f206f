"""Upload benchmark: a report file end to end (read, check, send, acknowledged) against a raw
producer.

    python -m jobs.bench.bench_upload [--n 1000000] [--partitions 4] [--format parquet|csv|jsonl]
                                      [--order numeric|text|shuffled] [--durable] [--repeat 1]
                                      [--json out/bench_upload.json]

In one run on the embedded broker (memory log; ``--durable``: the default local deployment's
disk-backed log):

1. **Raw producer**: kafka-python sending the upload's own batch messages (built beforehand, not
   timed) to their partitions, acks=all, until every one is acknowledged: the ceiling of sending
   exactly these bytes with this client.
2. **Upload**: what :func:`pipeline.upload.upload_file` does, from the file on disk, in one pass:
   each chunk read, checked (every value coded, users, domains and repeats checked) and built
   into its messages, which are handed to the producer at once (its sender thread ships them
   while the next chunk is read), every message with the upload's header; once every one is
   acknowledged, a commit record to each partition sent to, until those are acknowledged too —
   what ``dpstream produce`` does after its own checks. The producer is made in a thread while
   the file is opened (:class:`pipeline.upload.EarlyProducer`: the topic's existence checked by
   listing the broker's topics, then the client's connection and the topic's metadata), as
   ``upload_file`` does; the raw producer's time includes its client's creation too, so both
   pay for one client.

Both send the same step of the same users to the same topic (no worker runs: the broker's work is
the same). The ratio is raw seconds / upload seconds (≥ 0.5 is the goal). ``--repeat R`` (R > 1)
first sends once each way untimed (the clients' first-use costs, which would otherwise fall on the
raw producer, timed first), then times R pairs, raw first in even pairs and the upload first in odd
ones, and reports each pair's ratio and their median: one pair's ~0.1 s times move with a
scheduler's burst, a median of pairs in one process much less. Peak memory is measured in a fresh
process that checks the file and builds every message (all but the network). The upload's seconds
per million reports are what docs/streaming.md ("How long an upload takes") plans deadlines with.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import yaml

from jobs.bench import write_json
from jobs.bench.own_broker import use_own_brokers


def _config(n: int, partitions: int, services) -> dict:
    return {
        "name": "bench-upload",
        "broker": services.broker.bootstrap,
        "redis": services.redis.url,
        "roster": {"size": n},
        "horizon": 12,
        "topics": {"partitions": partitions},
        "attributes": {
            "poverty": {"type": "binary"},
            "employment": {"type": "categorical", "values": ["employed", "unemployed", "inactive"]},
        },
        "budget": {"rho": 0.5},
        "random": {"kind": "seeded", "seed": 1},
        "releases": [{"name": "cu", "type": "cumulative", "attribute": "poverty", "share": 1.0}],
    }


def _shuffled(ids: list[str]) -> list[str]:
    order = np.random.default_rng(7).permutation(len(ids))
    return [ids[i] for i in order.tolist()]


# the file's order of reports, from the roster's ids in row order
ORDERS: dict[str, Callable[[list[str]], list[str]]] = {
    "numeric": list,
    "text": sorted,
    "shuffled": _shuffled,
}


def write_file(path: Path, ids: list[str], step: int, seed: int = 0) -> Path:
    """One step's reports of every user: a binary and a categorical (label) column."""
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    labels = np.array(["employed", "unemployed", "inactive"], dtype=object)
    table = pa.table(
        {
            "user": pa.array(ids),
            "step": np.full(len(ids), step, dtype=np.int64),
            "poverty": rng.integers(0, 2, len(ids)),
            "employment": pa.array(labels[rng.integers(0, 3, len(ids))].tolist()),
        }
    )
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        pq.write_table(table, path)
    elif path.suffix == ".csv":
        import pyarrow.csv as pcsv

        pcsv.write_csv(table, path)
    else:
        import orjson

        with path.open("wb") as fh:
            for rep in table.to_pylist():
                fh.write(
                    orjson.dumps(
                        {
                            "user": rep["user"],
                            "step": rep["step"],
                            "values": {"poverty": rep["poverty"], "employment": rep["employment"]},
                        }
                    )
                    + b"\n"
                )
    return path


def raw_send(bootstrap: str, topic: str, batches) -> float:
    """Seconds for kafka-python to send the messages to their partitions and have all
    acknowledged, from the client's creation to its close (as the upload is timed)."""
    from pipeline.upload import batch_producer

    started = time.perf_counter()
    producer = batch_producer(bootstrap)  # the upload's own settings: the same sends, raw
    try:
        futures = [producer.send(topic, value=b.value, partition=b.partition) for b in batches]
        producer.flush()
        for future in futures:
            future.get(timeout=60)
    finally:
        producer.close()
    return time.perf_counter() - started


def _timed_upload(path: Path, deployment, bootstrap: str, topic: str) -> tuple[float, dict]:
    """What upload_file does, timed: the producer made while the file is opened, then the one
    pass until every message and every commit record is acknowledged; (seconds, stages)."""
    from pipeline.upload import EarlyProducer, open_upload, send_upload

    started, cpu = time.perf_counter(), time.process_time()
    early = EarlyProducer(bootstrap, topic)  # made while the file is opened
    sent = send_upload(open_upload(path, deployment), bootstrap, topic, early=early)
    upload = time.perf_counter() - started
    stages = {"upload_cpu_s": time.process_time() - cpu}  # this process only, not the broker's
    if sent.failed or sent.acknowledged != deployment.n or not sent.committed:
        raise RuntimeError(
            f"upload acknowledged {sent.acknowledged:,} of {deployment.n:,} "
            f"(committed: {sent.committed}): {sent.failed[:3]}"
        )
    return upload, stages


def peak_memory_mb(config: Path, path: Path) -> float:
    """Peak RSS (MB) of a fresh process that checks the file and builds every message, as
    ``dpstream produce`` does (all but the network). Its own peak (``VmHWM``, of the memory the
    program has since it started), not ``ru_maxrss``: Linux carries that across ``exec`` from the
    memory the process had before, which is this benchmark's when the child is spawned by vfork
    (its 10^6 ids and messages: ~100-150 MB more)."""
    import subprocess
    import sys

    code = (
        "import re, sys\n"
        "from pipeline.config import load_config\n"
        "from pipeline.upload import open_upload\n"
        "deployment = load_config(sys.argv[1])\n"
        "for _ in open_upload(sys.argv[2], deployment).messages(): pass\n"
        "status = open('/proc/self/status').read()\n"
        "print(re.search(r'VmHWM:\\s+(\\d+) kB', status).group(1))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(config), str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return int(out.split()[-1]) / 1024


def main(argv=None) -> dict:
    use_own_brokers("bench_upload")  # never a running `up`'s gate
    from pipeline.config import load_config
    from pipeline.stream.kafka.topics import ensure_topics
    from pipeline.stream.local.embedded import EmbeddedServices
    from pipeline.upload import open_upload

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--format", choices=["parquet", "csv", "jsonl"], default="parquet")
    ap.add_argument(
        "--order",
        choices=sorted(ORDERS),
        default="numeric",
        help="the reports' order in the file: by roster row (ids of one length chunk by chunk), "
        "by id as text (a database's ORDER BY of a text id: ids of several lengths in every "
        "chunk) or shuffled",
    )
    ap.add_argument(
        "--durable", action="store_true", help="the broker's log on disk (as `dpstream up`)"
    )
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="timed pairs (raw and upload, alternating which goes first) after an untimed one; "
        "the ratio is their median",
    )
    ap.add_argument("--out", default="out/bench_upload")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error(f"--repeat must be at least 1, got {args.repeat}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result: dict = {
        "n": args.n,
        "partitions": args.partitions,
        "format": args.format,
        "order": args.order,
        "durable": args.durable,
    }
    with EmbeddedServices(broker_log=out / "broker.log", durable_log=args.durable) as svc:
        cfg_path = out / "bench-upload.yaml"
        cfg_path.write_text(yaml.safe_dump(_config(args.n, args.partitions, svc)))
        deployment = load_config(cfg_path)
        topic = ensure_topics(svc.broker.bootstrap, deployment)["reports"]
        ids = ORDERS[args.order]([f"{deployment.roster.id_prefix}{i}" for i in range(args.n)])
        path = write_file(out / f"step1.{args.format}", ids, 1)
        del ids
        prepared = open_upload(path, deployment).batches  # what the raw producer sends (not timed)
        result["messages"] = len(prepared)
        result["bytes"] = sum(len(b.value) for b in prepared)
        print(
            f"n={args.n:,} reports, {args.partitions} partitions, {args.format}, "
            f"ids in {args.order} order: "
            f"{len(prepared)} batch messages, {result['bytes'] / 1e6:.1f} MB",
            flush=True,
        )
        if args.repeat > 1:  # untimed: both clients' first use (protocol tables, imports)
            raw_send(svc.broker.bootstrap, topic, prepared)
            _timed_upload(path, deployment, svc.broker.bootstrap, topic)
        pairs = []
        for pair in range(args.repeat):
            if pair % 2 == 0:
                raw = raw_send(svc.broker.bootstrap, topic, prepared)
                upload, stages = _timed_upload(path, deployment, svc.broker.bootstrap, topic)
            else:
                upload, stages = _timed_upload(path, deployment, svc.broker.bootstrap, topic)
                raw = raw_send(svc.broker.bootstrap, topic, prepared)
            pairs.append({"raw_s": raw, "upload_s": upload, "ratio": raw / upload, **stages})
            print(
                "upload stages: " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()),
                flush=True,
            )
        del prepared
        result["pairs"] = pairs
        result["stages"] = {k: float(np.median([p[k] for p in pairs])) for k in stages}
        raw = float(np.median([p["raw_s"] for p in pairs]))
        upload = float(np.median([p["upload_s"] for p in pairs]))
        ratio = float(np.median([p["ratio"] for p in pairs]))
        result["peak_rss_mb"] = peak_memory_mb(cfg_path, path)
        print(
            f"peak RSS of a process checking the file and building its messages: "
            f"{result['peak_rss_mb']:.0f} MB",
            flush=True,
        )
    result.update(
        raw_s=raw,
        upload_s=upload,
        ratio=ratio,
        upload_s_per_million=upload * 1e6 / args.n,
        raw_reports_per_s=args.n / raw,
        upload_reports_per_s=args.n / upload,
    )
    print(f"raw producer, same messages: {raw:.2f} s ({args.n / raw:,.0f} reports/s)", flush=True)
    print(
        f"upload end to end:           {upload:.2f} s ({args.n / upload:,.0f} reports/s, "
        f"{upload * 1e6 / args.n:.2f} s per million)",
        flush=True,
    )
    if len(pairs) > 1:
        each = " ".join(f"{p['ratio']:.2f}" for p in pairs)
        print(f"ratio raw / upload, pair by pair: {each}", flush=True)
        print("(the times above are medians over the pairs)", flush=True)
    print(f"ratio raw / upload: {ratio:.2f}", flush=True)
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
