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

from pipeline.config import load_config
from pipeline.stream.kafka.topics import ensure_topics


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--replication", type=int, default=int(os.environ.get("DPSTREAM_TOPIC_REPLICATION", "1")))
    args = ap.parse_args(argv)
    dep = load_config(args.config)
    bootstrap = os.environ.get("DPSTREAM_BROKER") or dep.broker
    if not bootstrap:
        raise SystemExit("no broker: set `broker:` in the configuration or DPSTREAM_BROKER")
    from kafka.errors import KafkaError

    try:  # the broker may still be starting: the admin client retries for up to two minutes
        names = ensure_topics(bootstrap, dep, timeout=120.0, replication=args.replication)
    except KafkaError as err:  # (a RuntimeError too: caught first) unreachable or refusing broker
        raise SystemExit(f"create_topics: broker {bootstrap}: {err!r}")
    except RuntimeError as err:  # an existing topic with another partition count
        raise SystemExit(f"create_topics: {err}")
    print(f"topics ready on {bootstrap}: {', '.join(sorted(names.values()))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
