"""What a job's supervision promises whatever its tasks do: it ends when a task fails, the
startup steps run under the tasks that watch them, and a task that swallows a cancellation (as a
client library did in a releaser whose broker was gone) does not keep the process alive.

In-process, on a real event loop; the jobs that use these run against the embedded broker in
tests/test_up_supervision.py."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time

import pytest

from pipeline.stream.process.supervision import cancel_and_wait, closed_within, supervise


class Boom(Exception):
    pass


async def _swallows_one_cancel(ticks: list[float]) -> None:
    """A loop whose step swallows the first cancellation that reaches it, then goes on looping."""
    swallowed = False
    while True:
        try:
            await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed = True
        ticks.append(time.monotonic())


async def _fail_after(seconds: float) -> None:
    await asyncio.sleep(seconds)
    raise Boom("watched thing lost")


def test_a_task_that_swallows_a_cancellation_is_cancelled_again():
    async def main() -> tuple[set, bool]:
        ticks: list[float] = []
        task = asyncio.create_task(_swallows_one_cancel(ticks))
        await asyncio.sleep(0.1)
        left = await cancel_and_wait([task], "test", bound=5.0)
        return left, task.done()

    left, done = asyncio.run(main())
    assert left == set() and done


def test_a_task_that_never_ends_is_returned_after_the_bound(caplog):
    released = False

    async def stubborn() -> None:
        while not released:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                pass

    async def main() -> tuple[set, float]:
        nonlocal released
        task = asyncio.create_task(stubborn())
        await asyncio.sleep(0.1)  # inside its loop (a task cancelled before its first step just ends)
        started = time.monotonic()
        left = await cancel_and_wait([task], "test", bound=1.0)
        elapsed = time.monotonic() - started
        released = True  # let it end, or asyncio.run would wait on it for ever
        await task
        return left, elapsed

    left, elapsed = asyncio.run(asyncio.wait_for(main(), 10))
    assert len(left) == 1 and 1.0 <= elapsed < 3.0
    assert "a task did not end when cancelled" in caplog.text and "stubborn" in caplog.text


def test_a_failure_during_startup_ends_supervision_with_it():
    """The watchdog fails while the startup steps still run: supervise raises its error at once."""

    async def slow_startup() -> list[asyncio.Task]:
        await asyncio.sleep(30)
        return []

    async def main() -> None:
        await supervise([asyncio.create_task(_fail_after(0.2))], "test", startup=slow_startup)

    started = time.monotonic()
    with pytest.raises(Boom):
        asyncio.run(asyncio.wait_for(main(), 10))
    assert time.monotonic() - started < 5


def test_the_loops_startup_returns_are_supervised_and_a_swallowed_cancel_does_not_hold_the_end():
    ticks: list[float] = []

    async def startup() -> list[asyncio.Task]:
        await asyncio.sleep(0.1)
        return [
            asyncio.create_task(_swallows_one_cancel(ticks)),
            asyncio.create_task(_fail_after(0.3)),
        ]

    async def main() -> None:
        await supervise([asyncio.create_task(asyncio.sleep(60))], "test", startup=startup)

    with pytest.raises(Boom):
        asyncio.run(asyncio.wait_for(main(), 10))
    assert ticks, "the loop started by startup() never ran"


def test_a_close_that_hangs_is_left_after_its_timeout_and_the_others_close():
    closed: list[str] = []

    async def hangs() -> None:
        await asyncio.sleep(60)

    async def quick() -> None:
        closed.append("quick")

    async def main() -> float:
        started = time.monotonic()
        await closed_within({"hanging client": hangs(), "quick client": quick()}, timeout=0.5)
        return time.monotonic() - started

    assert asyncio.run(main()) < 3
    assert closed == ["quick"]


def test_a_job_whose_client_task_ignores_every_cancellation_still_exits():
    """run_job ends the process even when a task left behind by a client never ends (asyncio.run
    would otherwise wait on it for ever)."""
    script = textwrap.dedent(
        """
        import asyncio
        from pipeline.stream.process.supervision import run_job

        async def stubborn():
            while True:
                try:
                    await asyncio.sleep(0.05)
                except asyncio.CancelledError:
                    pass

        async def job():
            asyncio.create_task(stubborn())
            await asyncio.sleep(0.1)
            raise RuntimeError("the job failed")

        run_job(job)
        """
    )
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert "a task did not end when cancelled" in proc.stderr
    assert time.monotonic() - started < 30
