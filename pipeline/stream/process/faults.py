"""Crash points for fault-injection tests (inactive unless ``DPSTREAM_FAULT`` is set).

``DPSTREAM_FAULT=<point>@<step>`` makes the process exit abruptly (``os._exit``, no cleanup, like
``kill -9``) when it reaches ``point`` while handling ``step``. Points of the release protocol:

  releaser.before_commit   mechanisms ran, nothing written to Redis
  releaser.after_commit    the step's record is in Redis, nothing published
  releaser.mid_publish     about half of the step's messages acknowledged by the broker
  worker.before_checkpoint partial published and acknowledged, checkpoint not yet written
  worker.before_partial    the step's forwarded-through markers sent, its partial not published
  worker.after_forward     reports of other partitions' users forwarded to ``repartition`` and
                           acknowledged (``step``: the open step), no checkpoint covering them
                           (reached when the worker awaits them: the next fetch, or before a
                           forwarded-through marker or checkpoint)
"""

from __future__ import annotations

import os

__all__ = ["crash_point", "FAULT_EXIT_CODE"]

FAULT_EXIT_CODE = 86


def crash_point(point: str, step: int) -> None:
    spec = os.environ.get("DPSTREAM_FAULT")
    if spec and spec == f"{point}@{step}":
        os._exit(FAULT_EXIT_CODE)
