"""What both stream jobs do around their work: logging, and running their tasks until
a signal or a failure (a failure exits non-zero, for a supervisor to restart the process: all a job
needs to resume is in Redis and the log)."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import Awaitable, Callable

__all__ = ["run_job", "supervise"]

log = logging.getLogger("dpstream.process")


def run_job(job: Callable[[], Awaitable[None]], loglevel: str = "info") -> None:
    """Configure logging and run ``job()`` in a new event loop (aiokafka clients must be created
    inside the running loop, so ``job`` builds them). A refusal to start on the Redis state
    (:class:`pipeline.stream.state.identity.StateRefused`, or a state blob of another format version)
    exits with its code and one line on stderr; so does a refused login or TLS handshake (exit code 1,
    :func:`pipeline.connections.connection_failure`)."""
    from pipeline.connections import connection_failure
    from pipeline.serialization import StateFormatError
    from pipeline.stream.state.identity import StateLost, StateRefused

    logging.basicConfig(
        level=loglevel.upper(),
        format="[%(asctime)s] [%(process)d] [%(levelname)s] %(name)s: %(message)s",
    )
    logging.getLogger("aiokafka").setLevel(logging.WARNING)

    async def main() -> None:
        await job()

    try:
        asyncio.run(main())
    except StateRefused as err:
        print(f"dpstream: {err.label}: {err}", file=sys.stderr)
        raise SystemExit(err.exit_code) from None
    except StateFormatError as err:  # a state of another format version (pipeline.serialization)
        print(f"dpstream: state refused: {err}", file=sys.stderr)
        raise SystemExit(StateLost.exit_code) from None
    except (
        Exception
    ) as err:  # a refused login, a TLS failure, an unreadable secret: one line naming the key
        line = connection_failure(err)
        if line is None:
            raise
        print(f"dpstream: {line}", file=sys.stderr)
        raise SystemExit(1) from None


async def supervise(
    tasks: list[asyncio.Task],
    name: str,
    drain: Callable[[], Awaitable[None]] | None = None,
    drain_timeout: float = 10.0,
) -> None:
    """Wait until SIGTERM/SIGINT or until a task ends; re-raise a task's exception. On a signal, ``drain()``
    first finishes the work in hand (a worker's fetch: its partials, checkpoints and intake counts), at
    most ``drain_timeout`` seconds. Every task is then cancelled (mid-fetch is safe: nothing past the
    last checkpoint is kept)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stopper = asyncio.create_task(stop.wait())
    try:
        done, _ = await asyncio.wait([*tasks, stopper], return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            if (
                task is not stopper
                and not task.cancelled()
                and (err := task.exception()) is not None
            ):
                log.error("%s failing: %r", name, err)
                raise err
        log.info("%s stopping", name)
        if drain is not None:
            try:
                await asyncio.wait_for(drain(), drain_timeout)
            except TimeoutError:
                log.warning(
                    "%s: the work in hand did not finish within %g s; stopping anyway",
                    name,
                    drain_timeout,
                )
    finally:
        for task in (*tasks, stopper):
            task.cancel()
        await asyncio.gather(*tasks, stopper, return_exceptions=True)
