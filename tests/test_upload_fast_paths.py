"""The upload's vectorised shortcuts against their references: murmur2 of Arrow string buffers
against Kafka's partitioner, a range roster's rows against the canonical-id rule, the check's
repeat bitmaps against a plain scan; and the producer made while the file is checked."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from kafka.partitioner.default import murmur2 as kafka_murmur2
from support.range_roster import canonical_row, range_config

from pipeline.allocator import keep_freed_memory
from pipeline.arrow_arrays import string_buffers, strings
from pipeline.config import parse_config
from pipeline.stream.ingest.murmur import murmur2_of_bytes, partitions_of
from pipeline.stream.ingest.report_files import ReportFileError
from pipeline.stream.ingest.roster import Roster, murmur2_partition
from pipeline.upload_check import FileCheck
from pipeline.upload_columns import Columns
from pipeline.upload_rows import UserRows

_ALPHABET = list("az09_-\"\\ é€😀\x00\n")


def _random_ids(rng, count: int, lengths) -> list[str]:
    return ["".join(rng.choice(_ALPHABET, size=int(n))) for n in rng.choice(lengths, count)]


def _hashes_of(ids: list[str], large: bool = False, cut: int = 0) -> np.ndarray:
    """murmur2 of the ids as the upload computes it: from a string array's buffers (``cut``: the
    array is a slice, its offsets not starting at 0)."""
    arr = strings(["pad"] * cut + ids, large=large).slice(cut)
    raw, offsets = string_buffers(arr)
    return murmur2_of_bytes(raw, offsets)


def _kafka(ids: list[str]) -> list[int]:
    return [kafka_murmur2(u.encode("utf-8")) for u in ids]


def test_murmur2_of_bytes_is_kafkas_for_every_length_alone_and_mixed():
    """Byte strings of every length 0..40 (UTF-8 of ASCII, accented letters, emoji, NUL): alone
    (every id of one length: the strided path), all lengths in one array (the gathered path), and
    arrays that are slices; the partition is the default partitioner's."""
    rng = np.random.default_rng(31)
    for length in range(41):
        ids = ["".join(rng.choice(_ALPHABET[:5], size=length)) for _ in range(40)]
        assert _hashes_of(ids).tolist() == _kafka(ids), length
        raw_ids = [bytes(rng.integers(0, 256, length).astype(np.uint8)) for _ in range(40)]
        data = np.frombuffer(b"".join(raw_ids), dtype=np.uint8)
        got = murmur2_of_bytes(data, np.arange(41) * length)
        assert got.tolist() == [kafka_murmur2(k) for k in raw_ids], length
    mixed = _random_ids(rng, 3000, np.arange(41))
    for large in (False, True):
        for cut in (0, 3):
            assert _hashes_of(mixed, large, cut).tolist() == _kafka(mixed)
    for partitions in (1, 3, 4, 16):
        assert partitions_of(mixed, partitions).tolist() == [
            murmur2_partition(u.encode("utf-8"), partitions) for u in mixed
        ]
    assert _hashes_of([]).size == 0


def test_murmur2_of_a_chunk_of_ids_of_a_few_lengths():
    """A chunk of a range roster's ids: lengths change inside it (u99999, u100000), in file order
    and shuffled."""
    ids = [f"u{i}" for i in range(99_000, 101_000)] + [f"u{i}" for i in range(7)]
    assert _hashes_of(ids).tolist() == _kafka(ids)
    order = np.random.default_rng(1).permutation(len(ids))
    shuffled = [ids[i] for i in order]
    assert _hashes_of(shuffled).tolist() == _kafka(shuffled)


def _coded(name: str, **attributes: dict):
    """A small deployment with a binary attribute ``flag`` and ``attributes``, to code columns."""
    return parse_config(
        {
            "name": name,
            "roster": {"size": 4},
            "horizon": 2,
            "attributes": {"flag": {"type": "binary"}, **attributes},
            "budget": {"rho": 1.0},
            "releases": [{"name": "c", "type": "cumulative", "attribute": "flag", "share": 1.0}],
        }
    )


def _candidates(rng, prefix: str, size: int) -> list[str]:
    near = [0, 1, 9, 10, size - 1, size, size + 1, 10 * size]
    ids = [f"{prefix}{n}" for n in near + rng.integers(0, 2 * size + 2, 60).tolist()]
    ids += [f"{prefix}0{n}" for n in (0, 1, 7, size - 1)]  # leading zeros
    ids += [f"{prefix}+1", f"{prefix}-1", f"{prefix} 1", f"{prefix}1 ", f"{prefix}1.0"]
    ids += [prefix, "", f"x{prefix}1", f"{prefix[:-1]}1", f"{prefix.upper()}1", f"{prefix}{prefix}1"]
    ids += [f"{prefix}{'9' * 18}", f"{prefix}{'1' * 19}", f"{prefix}{'0' * 18}", f"{prefix}٣"]
    ids += [f"{prefix}{n}"[:-1] + c for n in near[:5] for c in "/:@é"]  # a last byte not a digit
    return ids


@pytest.mark.parametrize("prefix", ["", "u", "hh", "abc", "user", "house-", "household-", "é"])
def test_range_roster_rows_follow_the_canonical_rule(prefix):
    """Leading zero, sign, blanks, too many digits, prefix mismatch, at or above the size: -1;
    ids of mixed lengths and ids all of one length (the two read paths); rosters whose largest
    row has 1, 7, 9 and 12 digits (one, two and three 8-digit words)."""
    rng = np.random.default_rng(len(prefix))
    for size in (1, 10, 11, 1000, 1_234_567, 100_000_001, 123_456_789_012):
        rows = UserRows(parse_config_roster(prefix, size), lambda: None)
        ids = _candidates(rng, prefix, size)
        rng.shuffle(ids)
        expected = [canonical_row(u, prefix, size) for u in ids]
        assert rows.rows(strings(ids)).tolist() == expected, (prefix, size)
        for length in {len(u.encode()) for u in ids}:
            same = [u for u in ids if len(u.encode()) == length]
            got = rows.rows(strings(same, large=True)).tolist()
            assert got == [canonical_row(u, prefix, size) for u in same], (prefix, size, length)
        if size <= 1000:  # the workers' roster agrees with the rule
            roster = Roster.from_range(size, prefix)
            assert [roster.row(u) for u in ids] == expected


def parse_config_roster(prefix: str, size: int):
    return parse_config(range_config(size, prefix)).roster


def _first_repeat(pairs: list[tuple[str, int]]) -> int | None:
    seen: set[tuple[str, int]] = set()
    for at, pair in enumerate(pairs):
        if pair in seen:
            return at
        seen.add(pair)
    return None


@pytest.mark.parametrize("size", [300, 100_000])  # bitmap counted / rows sorted
def test_the_check_finds_the_first_repeat_as_a_plain_scan_does(size):
    """Repeats inside a chunk (rows in any order), across chunks and at one step of a chunk of
    several steps: the first one found is a plain scan's; a refused chunk leaves the bitmaps as
    they were (the next clean chunk passes and is counted once)."""
    dep = parse_config(range_config(size))
    rng = np.random.default_rng(size)
    for trial in range(60):
        chunks = [rng.integers(0, 300, int(rng.integers(1, 40))) for _ in range(3)]
        steps = [rng.integers(1, 3 if trial % 2 else 2, c.size) for c in chunks]
        check = FileCheck(dep.horizon, dep.n, UserRows(dep.roster, lambda: None))
        pairs: list[tuple[str, int]] = []
        start = 0
        for users, at_steps in zip(chunks, steps):
            chunk_pairs = [(f"u{u}", int(t)) for u, t in zip(users.tolist(), at_steps.tolist())]
            expected = _first_repeat(pairs + chunk_pairs)
            before = {t: bitmap.copy() for t, bitmap in check.present.items()}
            columns = Columns(
                start,
                strings([u for u, _ in chunk_pairs]),
                at_steps.astype(np.int64),
                {"poverty": np.zeros(users.size, dtype=np.int64)},
            )
            problem = check.problem(columns)
            if expected is None:
                assert problem is None, trial
                pairs += chunk_pairs
                start += users.size
                continue
            assert problem is not None and problem.reason == "duplicate", trial
            assert problem.position == expected, trial
            assert {t: b.tolist() for t, b in check.present.items() if b.any()} == {
                t: b.tolist() for t, b in before.items() if b.any()
            }
            break
        assert check.reports == len(pairs)
        for t in {t for _, t in pairs}:
            marked = np.flatnonzero(check.present[t]).tolist()
            assert marked == sorted({int(u[1:]) for u, s in pairs if s == t})


def test_the_allocator_keeps_freed_memory_for_the_next_chunk():
    """glibc: the thresholds are set (a fresh mapping per numpy temporary was most of the check's
    time on the benchmark's machine); elsewhere nothing is changed and the answer is False."""
    import platform

    took = keep_freed_memory()
    assert took is (platform.libc_ver()[0] == "glibc")
    assert keep_freed_memory() is took  # once per process


def _log_size(bootstrap: str, topic: str) -> int:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        parts = [TopicPartition(topic, p) for p in consumer.partitions_for_topic(topic) or ()]
        return sum(consumer.end_offsets(parts).values())
    finally:
        consumer.close()


def test_the_producer_made_during_the_check_sends_the_file_and_a_refused_file_nothing(tmp_path):
    """Real broker: ``upload_file`` makes its producer in a thread while the file is opened
    (``EarlyProducer``); a file refused in its first chunk leaves the log as it was, a good one is
    acknowledged whole (its messages and a commit record a partition), and ``send_upload`` takes
    a producer made that way."""
    from pipeline.stream.kafka.topics import ensure_topics
    from pipeline.stream.local.embedded import EmbeddedServices
    from pipeline.upload import EarlyProducer, open_upload, send_upload, upload_file

    users = [f"u{i}" for i in range(50)]
    good, bad = tmp_path / "good.parquet", tmp_path / "bad.parquet"
    pq.write_table(pa.table({"user": users, "step": [1] * 50, "poverty": [1] * 50}), good)
    pq.write_table(pa.table({"user": users + ["u7"], "step": [1] * 51, "poverty": [0] * 51}), bad)
    with EmbeddedServices(broker_log=tmp_path / "broker.log") as svc:
        bootstrap = svc.broker.bootstrap
        dep = parse_config(dict(range_config(50), broker=bootstrap, redis=svc.redis.url))
        topic = ensure_topics(bootstrap, dep)["reports"]
        with pytest.raises(ReportFileError, match="row 51: a second report for user 'u7'"):
            upload_file(bad, dep, bootstrap)
        assert _log_size(bootstrap, topic) == 0
        sent = upload_file(good, dep, bootstrap)
        assert sent.acknowledged == 50 and not sent.failed and sent.committed
        records = _log_size(bootstrap, topic)  # a message and a commit record a partition
        assert 2 <= records <= 2 * dep.topics.partitions and records % 2 == 0
        early = EarlyProducer(bootstrap, topic)
        again = send_upload(open_upload(good, dep), bootstrap, topic, early=early)
        assert again.acknowledged == 50 and _log_size(bootstrap, topic) == 2 * records


@pytest.mark.parametrize(
    "ids",
    [
        [f"u{i}" for i in range(100_000, 103_000)],  # one length: the ids joined as rows
        ["abcd", "wxyz", "ab\u00e9", "\U0001f600"] * 50,  # one length in bytes, 4: one word each
        [f"u{i}" for i in range(99_000, 101_000)],  # several lengths: Arrow joins them
        ['a"b', "c\\d", "e\nf", "ghi"] * 20,  # to be escaped: each encoded by orjson
    ],
)
def test_a_chunks_ids_are_listed_in_message_order_as_json(ids):
    """Every slice of the ids listed for messages is the JSON list of those ids, in the order
    given, whether the chunk's ids are of one length or several, plain or to be escaped, and
    when the string array is a slice of a longer one."""
    import json

    from pipeline.key_words import KeyWords
    from pipeline.upload_messages import _Listed

    users = strings(["pad"] * 3 + ids).slice(3)
    order = np.random.default_rng(2).permutation(len(ids))
    listed = _Listed(users, order, KeyWords(*string_buffers(users)))
    ordered = [ids[i] for i in order]
    rng = np.random.default_rng(3)
    for start, stop in [(0, len(ids)), (0, 1), (len(ids) - 1, len(ids))] + [
        tuple(sorted(rng.choice(len(ids) + 1, 2, replace=False))) for _ in range(20)
    ]:
        text = b"".join(bytes(piece) for piece in listed.listed(int(start), int(stop)))
        assert json.loads(text) == ordered[start:stop]


@pytest.mark.parametrize(
    "codes",
    [
        [0, 1] * 40,  # binary: written as digits once per chunk
        [9, 0, 3, 7] * 20,  # one digit, up to 9
        [0, 10, 3, 12] * 20,  # two digits: by orjson
        [0, -1, 2, 1] * 20,  # a missing one: null, by orjson
        [-1] * 80,  # none reported: the attribute is left out
    ],
)
@pytest.mark.parametrize("dtype", [np.int64, np.int8])  # a large domain's codes; a small one's
@pytest.mark.parametrize("bounds", [False, True])  # the check's bounds handed on, or not
def test_a_chunks_codes_are_listed_in_message_order_as_json(codes, dtype, bounds):
    """Every slice of an attribute's codes listed for messages is the JSON list of those codes
    in the order given (``null`` for a missing one; None when all are missing), whether written
    as digits once per chunk or by orjson per message, from int64 or int8 codes."""
    import json

    from pipeline.upload_messages import _CodeText

    values = np.array(codes, dtype=dtype)
    order = np.random.default_rng(4).permutation(values.size)
    text = _CodeText(values, order, (min(codes), max(codes)) if bounds else None)
    ordered = [None if c < 0 else c for c in values[order].tolist()]
    rng = np.random.default_rng(5)
    for start, stop in [(0, values.size), (0, 1), (values.size - 1, values.size)] + [
        tuple(sorted(rng.choice(values.size + 1, 2, replace=False))) for _ in range(20)
    ]:
        pieces = text.listed(int(start), int(stop))
        expected = ordered[start:stop]
        if all(c is None for c in expected):
            assert pieces is None
            continue
        assert json.loads(b"".join(bytes(p) for p in pieces)) == expected


def _text_deployment():
    """A binary and a hashed attribute: the text codes' shortcuts."""
    return parse_config(
        {
            "name": "text-codes",
            "roster": {"size": 4},
            "horizon": 2,
            "attributes": {"flag": {"type": "binary"}, "item": {"type": "hashed", "size": 50}},
            "budget": {"rho": 1.0},
            "releases": [{"name": "c", "type": "cumulative", "attribute": "flag", "share": 1.0}],
        }
    )


_CELLS = ["0", "1", "", "True", "FALSE", " 1", "01", "2", "/", ":", "1.0", "yes", None, "7", "x y", "+1"]


@pytest.mark.parametrize("large", [False, True])
def test_text_codes_of_a_long_column_are_those_of_each_cell_alone(large):
    """A long text column of a binary attribute is coded from its bytes where a cell is "0" or
    "1" and by its distinct values otherwise; of a hashed one, by its distinct values: each
    cell's code is the one it gets alone (a one-cell column takes neither shortcut), by CSV's
    rules and by JSON's, also for a slice of a column."""
    from pipeline.upload_columns import _codes

    dep = _text_deployment()
    rng = np.random.default_rng(5)
    for _ in range(3):
        cells = [_CELLS[i] for i in rng.integers(0, len(_CELLS), 400)]
        column = pa.array(["pad", *cells], pa.large_string() if large else pa.string()).slice(1)
        for attribute in dep.attributes.values():
            for csv_cells in (True, False):
                alone = [_codes(attribute, column.slice(i, 1), csv_cells)[0] for i in range(400)]
                assert _codes(attribute, column, csv_cells).tolist() == alone


def test_text_codes_of_long_columns_all_empty_all_null_or_signed():
    """Columns past the shortcuts' length that they must not misread: every cell empty (a data
    buffer of no bytes) or null, a null whose slot holds the byte "0", and integers with a sign,
    which CSV's rule reads as ``int`` does ("+1" is 1)."""
    from pipeline.attributes import MISSING, OUT_OF_DOMAIN
    from pipeline.upload_columns import _codes

    dep = _text_deployment()
    flag, item = dep.attributes["flag"], dep.attributes["item"]
    n = 300
    assert _codes(flag, pa.array([""] * n), True).tolist() == [MISSING] * n
    assert _codes(flag, pa.array([""] * n), False).tolist() == [OUT_OF_DOMAIN] * n
    for csv_cells in (True, False):
        assert _codes(flag, pa.array([None] * n, pa.string()), csv_cells).tolist() == [MISSING] * n
    # a null over the bytes "0": missing, not 0
    offsets = np.arange(n + 1, dtype=np.int32)
    valid = np.ones(n, dtype=bool)
    valid[::2] = False
    held = pa.Array.from_buffers(
        pa.string(),
        n,
        [pa.py_buffer(np.packbits(valid, bitorder="little")), pa.py_buffer(offsets),
         pa.py_buffer(b"0" * n)],
    )
    assert _codes(flag, held, True).tolist() == [MISSING, 0] * (n // 2)
    signed = pa.array(["+1", "-1", "+0", " +1 "] * (n // 4))
    assert _codes(flag, signed, True).tolist() == [1, OUT_OF_DOMAIN, 0, 1] * (n // 4)
    assert _codes(item, pa.array(["+7", "-7"] * (n // 2)), True).tolist() == [7, OUT_OF_DOMAIN] * (
        n // 2
    )


# cells on which Python's int() and the upload's whole-column rule used to disagree (underscores,
# other scripts' digits, other spaces, more than 18 digits), and their neighbours
_NUMBER_CELLS = ["0", "1", " 1 ", "+1", "-1", "-0", "01", "007", "+0999", "1_0", "\u0661", "\u00a01",
                 "1\u00a0", "\u20031", "\x1c1", "\t1\t", "0" * 21 + "1", "9" * 20, "1" * 18, "1" * 19,
                 "-" + "9" * 19, "+", "-", " ", "1.0", "1e0", "0x1", "true", " true", "abc", "5", "49", "50"]


@pytest.mark.parametrize("name", ["flag", "item"])
def test_a_csv_cell_is_a_number_by_one_rule_in_both_readers(name, tmp_path):
    """A CSV cell gets the same code from the upload's whole-column rule as from the per-report
    reader (``csv_value``, then the workers' decoder), which reads a file pyarrow cannot read as a
    table: a whole number is an optional sign and ASCII digits between ASCII spaces or no-break
    spaces, however many digits ("1_0" and Arabic-Indic digits are text, as is "1" after an
    em space). Before, Python's int() read "1_0" as 10 and the column rule read it as text."""
    from pipeline.attributes import MISSING
    from pipeline.upload_columns import _codes

    attribute = _text_deployment().attributes[name]
    decode = attribute.column_decoder()
    cells = _NUMBER_CELLS * 10  # long enough for the shortcuts of a long column
    per_report = [next(iter(decode([attribute.csv_value(c)]))) for c in cells]
    assert _codes(attribute, pa.array(cells), True).tolist() == per_report
    assert [_codes(attribute, pa.array([c]), True)[0] for c in cells] == per_report
    by_cell = dict(zip(cells, per_report))
    assert by_cell["1_0"] != 10 and by_cell["\u0661"] != 1 and by_cell["0" * 21 + "1"] == 1
    if name == "flag":
        assert by_cell["+0999"] == by_cell["9" * 20] == by_cell["1_0"] != MISSING
    else:  # a hashed attribute: text is hashed, a number outside 0..49 is outside the domain
        assert by_cell["49"] == 49 and by_cell["50"] == by_cell["9" * 20] == by_cell["-1"]


@pytest.mark.parametrize(
    "labels",
    [
        ["employed", "unemployed", "inactive"],
        ["", "a", "ab", "abcd", "abcde"],  # an empty label; labels that are others' prefixes
        ["é", "名前", "x" * 12, "y" * 11, "\x00"],  # UTF-8, exactly 12 bytes, a NUL
        [f"label-{i}" for i in range(16)],  # as many labels as are matched word by word
    ],
)
@pytest.mark.parametrize("large", [False, True])
def test_categorical_text_codes_are_arrows_index_of_each_label(labels, large):
    """A categorical attribute's text cells coded by comparing Arrow binary views' words are each
    cell's index in the labels by Arrow's ``index_in``, outside the domain otherwise: cells that
    are a label's prefix or extension, a label with a NUL or a space after it, other cases,
    cells longer than 12 bytes that start with a label, nulls (missing) and a slice of a
    column; more labels, or a longer one, are left to ``index_in``."""
    import pyarrow.compute as pc

    from pipeline.attributes import MISSING, OUT_OF_DOMAIN
    from pipeline.upload_columns import _codes, _label_codes

    dep = _coded("labels", status={"type": "categorical", "values": labels})
    attribute = dep.attributes["status"]
    near = [c for label in labels for c in (label, label + "\x00", label + " ", label[:-1],
                                             label.upper(), label + "xxxxxxxxxxxxx", " " + label)]
    cells_of = [*near, "", None, "x" * 13, "y" * 12, "other", "\x00" * 12]
    rng = np.random.default_rng(6)
    cells = [cells_of[i] for i in rng.integers(0, len(cells_of), 2000)]
    column = pa.array(["pad", *cells], pa.large_string() if large else pa.string()).slice(1)
    found = pc.index_in(column, value_set=pa.array(labels)).to_pylist()
    expected = [OUT_OF_DOMAIN if at is None else at for at in found]
    got = _label_codes(column, labels)
    assert got is not None and got.dtype == np.int8
    assert [g for g, c in zip(got.tolist(), cells) if c is not None] == [
        e for e, c in zip(expected, cells) if c is not None
    ]
    for csv_cells in (True, False):  # nulls missing; an empty cell too by CSV's rule
        codes = _codes(attribute, column, csv_cells).tolist()
        assert codes == [
            MISSING if c is None or (csv_cells and c == "") else e for e, c in zip(expected, cells)
        ]
    assert _label_codes(column, [*labels, "z" * 13]) is None
    assert _label_codes(column, [*labels, *(f"more-{i}" for i in range(17))]) is None


@pytest.mark.parametrize("high", [1, 12, 20_000, 2**31])  # a 16-bit key, and a 64-bit one
def test_message_order_is_a_stable_sort_by_step_then_owner(high):
    """The chunk's order for messages (its key made from the steps' bounds, as 16 bits when it
    fits) is the stable sort by step * partitions + the owner by Kafka's partitioner; the
    chunk's step and code bounds are its steps' and codes' lowest and highest."""
    from pipeline.upload_messages import message_order

    rng = np.random.default_rng(high)
    ids = [f"u{i}" for i in rng.integers(0, 10**6, 3000).tolist()]
    steps = rng.integers(max(1, high - 3), high + 1, len(ids)).astype(np.int64)
    codes = rng.integers(-2, 3, len(ids)).astype(np.int8)
    chunk = Columns(0, strings(ids), steps, {"poverty": codes})
    assert chunk.step_range == (int(steps.min()), int(steps.max()))
    assert chunk.code_range("poverty") == (int(codes.min()), int(codes.max()))
    assert Columns(0, strings([]), steps[:0], {"poverty": codes[:0]}).step_range == (0, 0)
    for partitions in (1, 3, 4):
        owners = np.array([murmur2_partition(u.encode(), partitions) for u in ids])
        expected = steps * partitions + owners
        key, order = message_order(chunk, partitions)
        assert order.tolist() == np.argsort(expected, kind="stable").tolist()
        assert key.tolist() == expected[order].tolist()


def test_codes_of_a_column_of_several_parts_are_those_of_the_column_whole():
    """A table's column of several batches (a CSV chunk's blocks) is coded part by part: the
    codes are those of the column combined, for parts short and long (the shortcuts' threshold),
    text of each attribute's kind, nulls, and integers."""
    from pipeline.upload_columns import _codes

    dep = _coded(
        "parts",
        item={"type": "hashed", "size": 50},
        status={"type": "categorical", "values": ["1", "True", "x y", "+1"]},
    )
    rng = np.random.default_rng(8)
    sizes = [3, 400, 1, 256, 257, 1000]
    text = [[_CELLS[i] for i in rng.integers(0, len(_CELLS), n)] for n in sizes]
    numbers = [[None if x == 9 else int(x) for x in rng.integers(-1, 10, n)] for n in sizes]
    for parts in (text, numbers):
        column = pa.chunked_array([pa.array(part) for part in parts])
        for attribute in dep.attributes.values():
            for csv_cells in (True, False):
                whole = _codes(attribute, column.combine_chunks(), csv_cells)
                assert _codes(attribute, column, csv_cells).tolist() == whole.tolist()
