"""The deployment's topics made from inside the broker gate's private network, while the gate is held.

``dpstream up`` runs this (through ``nsenter``, :meth:`pipeline.stream.local.gate_service.BrokerGate.enter`)
after restarting a broker whose log is memory-only, before it lets any client through the gate again: a
client naming a topic first would have the broker create it with its default partition count. Inside,
the broker listens on the address it advertises, in plain Kafka (the gate's TLS is outside), so the
ordinary admin client of :func:`pipeline.stream.kafka.topics.ensure_topics` reaches it; the admin client
also waits for a broker still starting.

    python -m pipeline.stream.local.inner_topics --config CONFIG --broker 127.0.0.1:PORT [--timeout S]

Exit 0 when every topic exists with its configured partition count; 1 with one line on stderr otherwise.
"""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.stream.local.inner_topics")
    ap.add_argument("--config", required=True)
    ap.add_argument("--broker", required=True)
    ap.add_argument("--timeout", type=float, default=30.0)
    args = ap.parse_args(argv)
    from pipeline.config import load_config
    from pipeline.stream.kafka.topics import ensure_topics

    try:
        ensure_topics(args.broker, load_config(args.config), timeout=args.timeout)
    except Exception as err:  # noqa: BLE001 - `up` prints the line
        print(str(err) or type(err).__name__, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
