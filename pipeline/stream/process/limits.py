"""Message size limits, one set for every client of a deployment (docs/streaming.md, "Message sizes").

* ``MAX_MESSAGE_BYTES``: the largest message dpstream's own clients produce (producers'
  ``max_request_size``) and the fetch size of its consumers (``max_partition_fetch_bytes``; a larger
  first record batch is still returned by the broker, so an oversized message never wedges a consumer).
  A broker must accept messages of this size (``message.max.bytes`` in deploy/).
* ``MAX_REPORT_BYTES``: a message on ``reports`` (one report, or a columnar batch of reports) larger
  than this is not parsed: it is dead-lettered with reason ``too_large``, and the reports around it
  are used. dpstream's producer sends batches far below it (5,000 users of a few attributes).
* ``DEAD_LETTER_COPY_BYTES``: a dead letter carries at most this many bytes of the original message
  (header ``dpstream-original-size`` gives the full size), so dead-lettering can never itself fail
  on a size limit.
* ``MAX_HELD_BYTES``: the uncommitted upload messages one partition holds
  (:mod:`pipeline.stream.ingest.uploads`); above it the oldest held upload is dead-lettered
  ``uncommitted``. They are in the worker's memory and in the partition's checkpoint (a Redis value
  is at most 512 MB); an upload of 10^6 reports is ~14 MB over all partitions.
"""

from __future__ import annotations

__all__ = ["MAX_MESSAGE_BYTES", "MAX_REPORT_BYTES", "DEAD_LETTER_COPY_BYTES", "MAX_HELD_BYTES"]

MAX_MESSAGE_BYTES = 8 << 20
MAX_REPORT_BYTES = (
    1 << 20
)  # Kafka's default message.max.bytes: what any broker takes from a report producer
DEAD_LETTER_COPY_BYTES = 64 << 10
MAX_HELD_BYTES = 256 << 20
