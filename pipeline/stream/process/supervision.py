"""What both stream jobs do around their work: logging, and running their tasks until
a signal or a failure (a failure exits non-zero, for a supervisor to restart the process: all a job
needs to resume is in Redis and the log)."""

from __future__ import annotations

import asyncio
import io
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

__all__ = ["cancel_and_wait", "closed_within", "run_job", "supervise"]

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
        try:
            await job()
        finally:  # what the job's clients left running; asyncio.run would wait on it for ever
            others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            if await cancel_and_wait(others, "exit", bound=5.0):
                logging.shutdown()
                os._exit(1)

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
    startup: Callable[[], Coroutine[Any, Any, list[asyncio.Task]]] | None = None,
) -> None:
    """Wait until SIGTERM/SIGINT or until a task ends; re-raise a task's exception. ``startup()``, when
    given, runs first beside ``tasks`` (e.g. the broker watchdog, which must cover the startup
    steps too) and returns the job's loops, supervised from then on. On a signal, ``drain()`` first
    finishes the work in hand (a worker's fetch: its partials, checkpoints and intake counts), at
    most ``drain_timeout`` seconds. Every task is then cancelled (mid-fetch is safe: nothing past the
    last checkpoint is kept), persistently: see :func:`cancel_and_wait`."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stopper = asyncio.create_task(stop.wait())
    running = [*tasks, stopper]
    starting: asyncio.Task | None = None if startup is None else asyncio.create_task(startup())
    try:
        while True:
            watched = running if starting is None else [*running, starting]
            done, _ = await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if (
                    task is not stopper
                    and not task.cancelled()
                    and (err := task.exception()) is not None
                ):
                    log.error("%s failing: %r", name, err)
                    raise err
            if starting is not None and done == {starting}:
                running.extend(starting.result())  # started: its loops are supervised from now on
                starting = None
                continue
            break
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
        await cancel_and_wait(running if starting is None else [*running, starting], name)


async def cancel_and_wait(
    tasks: list[asyncio.Task], name: str, bound: float = 10.0
) -> set[asyncio.Task]:
    """Cancel ``tasks`` and wait for them to end, cancelling what is left again every half second:
    a client library may swallow a cancellation (a releaser whose broker was gone kept its tick
    loop running after one, and the job never exited). Tasks still running after ``bound`` seconds
    are logged with their stacks and returned."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=0.5)
        if pending and loop.time() > deadline:
            for task in pending:
                stack = io.StringIO()
                task.print_stack(file=stack)
                log.error("%s: a task did not end when cancelled:\n%s", name, stack.getvalue())
            break
    return pending


async def closed_within(closes: dict[str, Awaitable[None]], timeout: float = 5.0) -> None:
    """Await the ``closes`` (what -> its close) side by side, each for at most ``timeout`` seconds.
    A client whose broker is gone flushes its unsent batches until its request timeout (40 s for
    aiokafka's producer); what it held was never acknowledged, so nothing is lost by not waiting:
    the restarted job redoes it. A close that ignores the timeout's cancellation is left behind."""

    async def bounded(what: str, close: Awaitable[None]) -> None:
        task = asyncio.ensure_future(close)
        done, _ = await asyncio.wait([task], timeout=timeout)
        if not done:
            log.warning("%s did not close within %g s; exiting without it", what, timeout)
            await cancel_and_wait([task], what, bound=1.0)
        elif not task.cancelled() and (err := task.exception()) is not None:
            log.warning("%s failed to close: %r", what, err)

    await asyncio.gather(*(bounded(what, close) for what, close in closes.items()))
