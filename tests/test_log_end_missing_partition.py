"""The log-end probe when ListOffsets' answer leaves a partition out: kafka-python's end_offsets
then raises KeyError for the whole request (seen in CI for `query --deployment` of a deployment
that does not exist: the embedded broker was still making the topic the request had just named).
Each partition is asked alone, and one still left out is read from 0."""

from __future__ import annotations

from kafka import TopicPartition

from pipeline.stream.kafka.log_end import _listed_ends


class _Consumer:
    """end_offsets as kafka-python answers it when the broker leaves ``missing`` out."""

    def __init__(self, ends: dict, missing: set):
        self.ends, self.missing = ends, missing

    def end_offsets(self, tps):
        if any(tp in self.missing for tp in tps):
            raise KeyError(next(tp for tp in tps if tp in self.missing))
        return {tp: self.ends[tp] for tp in tps}


def test_a_partition_left_out_is_read_from_zero_and_the_others_keep_their_ends():
    known, missing = TopicPartition("synthetic", 0), TopicPartition("no-such.synthetic", 0)
    consumer = _Consumer({known: 42}, {missing})
    assert _listed_ends(consumer, [known, missing]) == {known: 42, missing: 0}
    assert _listed_ends(consumer, [known]) == {known: 42}
