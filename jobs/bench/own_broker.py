"""The benchmarks and evaluations start brokers of their own and never connect to a running `up`.

``DPSTREAM_BROKER_TLS`` left set in the shell (the client files of some deployment's gate, as
docs/security.md suggests for the curator's own tools) is not theirs: with it their clients would
speak TLS to their own plain brokers and be refused (:mod:`pipeline.stream.kafka.listener_check`).
So it is dropped, once, with a line saying so; a gated benchmark (``bench_stream --gated``,
``bench_gate``) names its own gate's files itself.
"""

from __future__ import annotations

import os
import sys

from pipeline.stream.local.broker_tls import BROKER_TLS_ENV

__all__ = ["use_own_brokers"]


def use_own_brokers(program: str) -> None:
    """Forget an inherited ``DPSTREAM_BROKER_TLS`` (this process and what it starts)."""
    if os.environ.pop(BROKER_TLS_ENV, None):
        print(
            f"{program}: ignoring {BROKER_TLS_ENV} (another deployment's gate): it starts and uses "
            "brokers of its own",
            file=sys.stderr,
        )
