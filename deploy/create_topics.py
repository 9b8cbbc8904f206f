"""Create a deployment's topics with its partition counts before any worker starts.

The jobs never declare topics and the broker must not
auto-create them: an auto-created ``reports`` topic would get the broker's default partition
count, and users would be owned by the wrong partitions. Idempotent; exits non-zero when an
existing topic has another partition count.

    python /opt/dpstream/create_topics.py --config /etc/dpstream/dpstream.yaml [--replication 3]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from pipeline.config import load_config
from pipeline.connections import SecretUnavailable, kafka_security, use_security
from pipeline.stream.kafka.topics import ensure_topics, topic_names, topic_partitions


def create(bootstrap: str, deployment, replication: int, timeout: float = 120.0) -> dict[str, str]:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic
    from kafka.errors import TopicAlreadyExistsError

    names, parts = topic_names(deployment), topic_partitions(deployment)
    deadline = time.monotonic() + timeout
    while True:  # the broker may still be starting
        try:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap, **kafka_security(), client_id="dpstream-create-topics")
            break
        except Exception as err:
            if time.monotonic() > deadline:
                raise SystemExit(f"broker {bootstrap} not reachable: {err}")
            time.sleep(2)
    try:
        existing = set(admin.list_topics())
        # ensure_topics creates with replication 1; create here first with the cluster's factor.
        missing = [NewTopic(names[t], parts[t], replication) for t in names if names[t] not in existing]
        if missing:
            try:
                admin.create_topics(missing)
            except TopicAlreadyExistsError:
                pass  # another replica of this job won the race
    finally:
        admin.close()
    return ensure_topics(bootstrap, deployment, timeout=timeout)  # checks every partition count


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--replication", type=int, default=int(os.environ.get("DPSTREAM_TOPIC_REPLICATION", "1")))
    args = ap.parse_args(argv)
    dep = load_config(args.config)
    use_security(dep.security)
    try:
        kafka_security()  # a missing secret or TLS file fails now, not after the connection retries
    except SecretUnavailable as err:
        raise SystemExit(f"create_topics: {err}")
    bootstrap = os.environ.get("DPSTREAM_BROKER") or dep.broker
    if not bootstrap:
        raise SystemExit("no broker: set `broker:` in the configuration or DPSTREAM_BROKER")
    try:
        names = create(bootstrap, dep, args.replication)
    except RuntimeError as err:  # an existing topic with another partition count
        raise SystemExit(f"create_topics: {err}")
    print(f"topics ready on {bootstrap}: {', '.join(sorted(names.values()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
