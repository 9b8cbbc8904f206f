"""Read one release's synthetic records from dpstream's public topics into a pandas DataFrame.

Topics are named ``<prefix>.<deployment>.<topic>`` (prefix ``dpstream`` unless the deployment's
``topics.prefix`` says otherwise). Every record on them is keyed (docs/topics.md): a releaser that
restarts in the middle of publishing a step sends some records again, with the same key and the same
bytes, so a reader keeps one record per key. Each step's manifest (topic ``releases``) names the
columns the step added, the number of chunks carrying them and their SHA-256; a step is used only
when all its chunks are there and the checksum matches.

    python docs/examples/synthetic_to_pandas.py --bootstrap localhost:9092 \
        --deployment sipp-poverty --release poverty-quarterly --out quarterly.csv

Needs kafka-python, numpy and pandas. Reads from the start of the topics until no record arrives
for ``--idle-seconds``. The embedded broker of ``dpstream up`` takes only clients presenting its
deployment's certificate: pass ``--tls-dir`` the directory holding ``ca.pem``, ``client.pem`` and
``client.key`` (``broker_tls`` in ``$DPSTREAM_HOME/<deployment>.json``; default
``$DPSTREAM_BROKER_TLS``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

import numpy as np
import pandas as pd
from kafka import KafkaConsumer, TopicPartition
from kafka.errors import KafkaError


def tls_settings(tls_dir: str | None) -> dict:
    """kafka-python's mutual-TLS settings for the files in ``tls_dir`` (none without it)."""
    if not tls_dir:
        return {}
    return {"security_protocol": "SSL", "ssl_cafile": os.path.join(tls_dir, "ca.pem"),
            "ssl_certfile": os.path.join(tls_dir, "client.pem"),
            "ssl_keyfile": os.path.join(tls_dir, "client.key")}


def read_topic(bootstrap: str, topic: str, idle_seconds: float, tls: dict) -> pd.DataFrame:
    """Every record of ``topic`` from its start: columns key (str), raw (bytes), value (parsed JSON)."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                             consumer_timeout_ms=int(idle_seconds * 1000), **tls)
    partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or {0})]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    rows = [{"key": m.key.decode(), "raw": m.value, "value": json.loads(m.value)} for m in consumer]
    consumer.close()
    return pd.DataFrame(rows, columns=["key", "raw", "value"])


def dedupe_by_key(records: pd.DataFrame) -> pd.DataFrame:
    """One record per key. A republished record repeats its key with the same bytes; a key with two
    different values would mean a corrupted topic, so it is refused rather than guessed."""
    variants = records.groupby("key")["raw"].nunique()
    if (variants > 1).any():
        raise ValueError(f"keys with different values: {list(variants[variants > 1].index[:5])}")
    return records.drop_duplicates("key").reset_index(drop=True)


def checksum(columns: pd.DataFrame, dtype: str) -> str:
    """SHA-256 of the step's new columns: records x columns, record-major, each value in ``dtype``,
    little-endian (the manifest's synthetic.sha256)."""
    array = np.ascontiguousarray(columns.to_numpy(), dtype=np.dtype(dtype).newbyteorder("<"))
    return hashlib.sha256(array.tobytes()).hexdigest()


def synthetic_frame(manifests: pd.DataFrame, chunks: pd.DataFrame, release: str) -> pd.DataFrame:
    """The release's synthetic records (one row each, a column step_t per released step t), with every
    step checked against its manifest; stops at the first step not completely published yet."""
    manifests = manifests[manifests["value"].map(lambda v: v["release"] == release)]
    chunks = chunks[chunks["value"].map(lambda v: v["release"] == release)]
    if manifests.empty:
        raise SystemExit(f"no manifest of release {release!r} on the releases topic")
    by_step = {v["step"]: v for v in manifests["value"]}
    pieces = [pd.DataFrame({"record": np.arange(c["start"], c["stop"]), "column": int(step), "value": values,
                            "published_at_step": c["step"]})
              for c in chunks["value"] for step, values in c["values"].items()]
    long = pd.concat(pieces, ignore_index=True) if pieces else pd.DataFrame(
        columns=["record", "column", "value", "published_at_step"])
    released = []
    for step in sorted(by_step):
        syn = by_step[step].get("synthetic")
        if syn is None:  # nothing published at this step (e.g. a fixed window before step k)
            continue
        have = chunks["value"].map(lambda v: v["step"] == step).sum()
        if have < syn["chunks"]:
            print(f"step {step}: {have} of {syn['chunks']} chunks so far; stopping before it", file=sys.stderr)
            break
        new = long[long["published_at_step"] == step]
        columns = new.pivot(index="record", columns="column", values="value")[syn["columns"]]
        if len(columns) != syn["records"] or checksum(columns, syn["dtype"]) != syn["sha256"]:
            raise ValueError(f"step {step}: the chunks do not match the manifest's checksum")
        released.append(columns.rename(columns=lambda c: f"step_{c}"))
    frame = pd.concat(released, axis=1) if released else pd.DataFrame(index=pd.RangeIndex(0, name="record"))
    return frame


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bootstrap", required=True, help="the broker, host:port")
    p.add_argument("--deployment", required=True, help="the deployment's name (config: name)")
    p.add_argument("--prefix", default="dpstream", help="the deployment's topics.prefix (default dpstream)")
    p.add_argument("--release", required=True, help="a fixed_window or cumulative release")
    p.add_argument("--out", help="write the records as CSV here (default: print the first rows)")
    p.add_argument("--idle-seconds", type=float, default=3.0)
    p.add_argument("--tls-dir", default=os.environ.get("DPSTREAM_BROKER_TLS"),
                   help="ca.pem, client.pem, client.key for a broker taking mutual TLS only")
    args = p.parse_args(argv)

    topic, tls = f"{args.prefix}.{args.deployment}", tls_settings(args.tls_dir)
    try:
        manifests = read_topic(args.bootstrap, f"{topic}.releases", args.idle_seconds, tls)
        chunks = read_topic(args.bootstrap, f"{topic}.synthetic", args.idle_seconds, tls)
    except KafkaError as err:  # e.g. "Unable to bootstrap": nothing answered as a broker there
        hint = "" if tls else ("; the embedded broker of `dpstream up` needs --tls-dir (`broker_tls` "
                               "in $DPSTREAM_HOME/<deployment>.json)")
        print(f"{args.bootstrap}: {err}{hint}", file=sys.stderr)
        return 1
    unique_manifests, unique_chunks = dedupe_by_key(manifests), dedupe_by_key(chunks)
    dropped = len(manifests) - len(unique_manifests) + len(chunks) - len(unique_chunks)
    frame = synthetic_frame(unique_manifests, unique_chunks, args.release)
    print(f"{args.release}: {len(frame)} synthetic records x {frame.shape[1]} steps "
          f"(dropped {dropped} republished duplicate records)")
    if args.out:
        frame.to_csv(args.out)
    else:
        print(frame.head())
    return 0


if __name__ == "__main__":
    sys.exit(main())
