"""A quick command's exit (``produce``, ``status``: pipeline/cli/quick_exit.py) skips the
interpreter's teardown but keeps what that exit does outside the process: the exit code, the
standard streams' buffered output, ``atexit`` functions, non-daemon threads run to their end and a
thread pool's pending work done. Each is checked in a real process, beside the usual exit
(``sys.exit``), which also runs a module global's finaliser at teardown: the quick exit does not."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from pipeline.cli.quick_exit import is_quick

_SCRIPT = textwrap.dedent(
    """
    import atexit, sys, threading, time
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path
    from pipeline.cli.quick_exit import leave

    out = Path(sys.argv[1])

    class Torn:
        def __del__(self):
            (out / "teardown").write_text("ran")

    kept = Torn()  # a module global: finalised when the interpreter tears its modules down
    atexit.register(lambda: (out / "atexit").write_text("ran"))

    def late():
        time.sleep(0.3)
        (out / "thread").write_text("ran")

    threading.Thread(target=late).start()  # not a daemon: the exit waits for it
    pool = ThreadPoolExecutor(max_workers=1)
    pool.submit(lambda: (time.sleep(0.3), (out / "pool").write_text("ran")))
    sys.stdout.write("no line break, still buffered")  # a pipe: block-buffered
    if sys.argv[2] == "quick":
        leave(3)
    sys.exit(3)
    """
)


@pytest.mark.parametrize("how", ["quick", "usual"])
def test_the_quick_exit_keeps_what_the_usual_exit_does_outside_the_process(tmp_path, how):
    run = subprocess.run(
        [sys.executable, "-c", _SCRIPT, str(tmp_path), how],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 3, run.stderr
    assert run.stdout == "no line break, still buffered"
    assert run.stderr == ""
    for effect in ("atexit", "thread", "pool"):
        assert (tmp_path / effect).read_text() == "ran", effect
    # the teardown itself: what the quick exit leaves out
    assert (tmp_path / "teardown").exists() == (how == "usual")


@pytest.mark.parametrize(
    ("argv", "quick"),
    [
        (["produce", "--config", "d.yaml", "--csv", "f.csv"], True),
        (["status", "--config", "d.yaml"], True),
        (["up", "--config", "d.yaml"], False),
        (["export", "--config", "d.yaml", "--out", "x.csv"], False),  # writes a file
        (["--help"], False),
        ([], False),
    ],
)
def test_only_produce_and_status_end_without_the_teardown(argv, quick):
    assert is_quick(argv) is quick


def test_the_dpstream_command_ends_a_quick_command_with_its_code(tmp_path):
    """``python -m pipeline.cli`` goes through the quick exit for produce: a usage error (a file
    missing) still ends with its code and its message."""
    run = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "produce", "--config", str(tmp_path / "none.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and "none.yaml" in run.stderr, (run.returncode, run.stderr)
