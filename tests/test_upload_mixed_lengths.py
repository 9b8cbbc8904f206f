"""Ids of several lengths, none longer than 8 bytes (a range roster's ids in text or shuffled order):
the upload reads each as one word (``KeyWords.short``) and lists them in messages as Arrow binary
views. Each result is compared with what the general layout (every key's words gathered) and
Arrow's join of the strings give for the same ids, and with the rule or hash it implements:
roster rows, Kafka's murmur2 partitions, and the messages byte for byte."""

from __future__ import annotations

import numpy as np
import pytest
from kafka.partitioner.default import murmur2 as kafka_murmur2
from support.range_roster import canonical_row, range_config

import pipeline.key_words as key_words
import pipeline.upload_messages as upload_messages
from pipeline.arrow_arrays import int64s, string_buffers, strings
from pipeline.config import parse_config
from pipeline.key_words import SHORT, KeyWords
from pipeline.stream.ingest.murmur import murmur2_of_words, partition_of_hashes
from pipeline.stream.ingest.roster import murmur2_partition
from pipeline.upload_columns import Columns
from pipeline.upload_messages import _Listed, chunk_messages
from pipeline.upload_rows import UserRows

# one-byte, two-byte, three-byte and four-byte UTF-8, a NUL, a control character
_ALPHABET = list("az09_-é€😀\x00\n")


def _short_ids(seed: int, count: int = 600) -> list[str]:
    """Ids of 0 to 8 bytes of UTF-8, every length present (the empty id too)."""
    rng = np.random.default_rng(seed)
    ids: list[str] = []
    while len(ids) < count:
        text = "".join(rng.choice(_ALPHABET, size=int(rng.integers(0, 9))))
        if len(text.encode()) <= SHORT:
            ids.append(text)
    return ids + ["", "a" * SHORT, "😀😀", "é" * 4, "€" * 2]


def _words(ids: list[str], large: bool = False, cut: int = 3) -> KeyWords:
    """The ids' words from a string array that is a slice (offsets not starting at 0)."""
    return KeyWords(*string_buffers(strings(["pad"] * cut + ids, large=large).slice(cut)))


@pytest.fixture
def gathered(monkeypatch):
    """Makes KeyWords read every key by the general layout (no key counts as short)."""

    def words_of(ids: list[str], large: bool = False) -> KeyWords:
        with monkeypatch.context() as m:
            m.setattr(key_words, "SHORT", 0)
            made = _words(ids, large)
        assert not made.short
        return made

    return words_of


def _in_key(lengths: np.ndarray, side: str, distance: int, width: int) -> np.ndarray:
    """(keys, width) mask of a read's bytes that lie inside its key (only those are defined)."""
    j = np.arange(width)[None, :]
    if side == "start":
        return distance + j < lengths[:, None]
    return (j < distance) & (j >= distance - lengths[:, None])  # bytes end - distance + j


def _bytes_of(read: np.ndarray, width: int) -> np.ndarray:
    return np.ascontiguousarray(read).view(np.uint8).reshape(-1, width)


@pytest.mark.parametrize("large", [False, True])
def test_short_keys_read_as_the_general_layout_reads_them(gathered, large):
    """Every read murmur2 and the roster's rows make (words from the start and from the end, 32
    and 64 bits) agrees with the general layout's on every byte inside its key; the key held
    whole is its bytes and zeros after them."""
    ids = _short_ids(1)
    short, general = _words(ids, large), gathered(ids, large)
    assert short.short and short.longest == SHORT and short.shortest == 0
    lengths = short.lengths
    reads = [("start", d, "<u4") for d in (0, 4, 8)]
    reads += [("end", d, t) for d in (4, 8, 12, 16) for t in ("<u4", "<u8")]
    for side, distance, dtype in reads:
        width = np.dtype(dtype).itemsize
        if side == "start":
            got, want = short.from_start(distance), general.from_start(distance)
        else:
            got, want = short.from_end(distance, dtype), general.from_end(distance, dtype)
        mask = _in_key(lengths, side, distance, width)
        got_bytes, want_bytes = _bytes_of(got, width), _bytes_of(want, width)
        assert (got_bytes[mask] == want_bytes[mask]).all(), (side, distance, dtype)
    whole = [bytes(_bytes_of(short.left_aligned(), 8)[k]) for k in range(len(ids))]
    assert whole == [u.encode().ljust(8, b"\0") for u in ids]


def test_a_general_layouts_keys_are_not_held_whole():
    """A key longer than 8 bytes, or keys all of one length: the general reads, no whole key."""
    for ids in (["u1", "u123456789"], ["u1", "u2"]):
        words = _words(ids)
        assert not words.short
        with pytest.raises(ValueError, match="SHORT"):
            words.left_aligned()


def test_without_binary_views_short_keys_take_the_general_layout(monkeypatch):
    """A pyarrow that cannot cast to binary views (before 16): the general reads, same hashes."""
    ids = _short_ids(7)
    monkeypatch.setattr(key_words, "_has_views", lambda: False)
    words = _words(ids)
    assert not words.short
    assert murmur2_of_words(words).tolist() == [kafka_murmur2(u.encode()) for u in ids]


@pytest.mark.parametrize("partitions", [1, 3, 4, 16])
def test_murmur2_of_short_keys_of_several_lengths_is_kafkas(partitions):
    """Random short ids (every length 0-8, non-ASCII, NUL) and a range roster's ids in text
    order (u0, u1, u10, u100, ...): Kafka's murmur2 and its default partitioner's choice."""
    for ids in (_short_ids(2), sorted(f"u{i}" for i in range(20_000))):
        words = _words(ids)
        assert words.short
        hashes = murmur2_of_words(words)
        assert hashes.tolist() == [kafka_murmur2(u.encode()) for u in ids]
        assert partition_of_hashes(hashes, partitions).tolist() == [
            murmur2_partition(u.encode(), partitions) for u in ids
        ]


@pytest.mark.parametrize("prefix", ["", "u", "hh", "é"])
def test_range_rows_of_short_ids_follow_the_canonical_rule(gathered, prefix):
    """Ids up to 8 bytes of mixed lengths against rosters up to the largest whose ids all fit in
    8 bytes (its last id, the longest allowed, exactly 8): enrolled, leading zeros, signs, blanks,
    a wrong prefix, empty, non-ASCII, at or above the size; the rows are the rule's and the
    general layout's."""
    room = SHORT - len(prefix.encode())
    rng = np.random.default_rng(room)
    for size in sorted({1, 10, 11, 999, 10 ** (room - 1) + 7, 10**room}):
        rows = UserRows(parse_config(range_config(size, prefix)).roster, lambda: None)
        near = [0, 1, 9, 10, size - 1, size, size + 1] + rng.integers(0, 2 * size, 40).tolist()
        ids = [f"{prefix}{n}" for n in near] + [f"{prefix}0{n}" for n in (0, 1, 7)]
        ids += [f"{prefix}+1", f"{prefix}-1", f"{prefix} 1", f"{prefix}1 ", prefix, "", "x1"]
        ids += [f"{prefix}٣", f"{prefix}1é", f"{prefix}1/", f"{prefix}1:", "😀"]
        ids = [u for u in ids if len(u.encode()) <= SHORT]
        rng.shuffle(ids)
        assert f"{prefix}{size - 1}" in ids
        words = _words(ids)
        assert words.short, (prefix, size)
        expected = [canonical_row(u, prefix, size) for u in ids]
        assert rows.rows(strings(ids), words).tolist() == expected, (prefix, size)
        assert rows.rows(strings(ids), gathered(ids)).tolist() == expected, (prefix, size)


def _joined(ids: list[str]) -> bytes:
    return b'["' + b'","'.join(u.encode() for u in ids) + b'"]'


@pytest.mark.parametrize("large", [False, True])
def test_short_ids_are_listed_byte_for_byte_as_arrows_join_lists_them(monkeypatch, large):
    """Every slice of the ids listed for messages (binary views) is the JSON list ``["a","b"]``
    of those ids in the order given, byte for byte what Arrow's take and join give; ids of 8
    bytes (their separator passes the view's first word), empty and non-ASCII ones included."""
    ids = [u for u in _short_ids(3) if u.isprintable()]
    users = strings(["pad"] * 3 + ids, large=large).slice(3)
    order = np.random.default_rng(4).permutation(len(ids))
    ordered = [ids[i] for i in order]
    fast = _Listed(users, order, KeyWords(*string_buffers(users)))
    with monkeypatch.context() as m:
        m.setattr(upload_messages, "_joined_inline", lambda words, order: None)
        arrow = _Listed(users, order, KeyWords(*string_buffers(users)))
    rng = np.random.default_rng(5)
    slices = [(0, len(ids)), (0, 1), (len(ids) - 1, len(ids))] + [
        tuple(int(x) for x in sorted(rng.choice(len(ids) + 1, 2, replace=False))) for _ in range(30)
    ]
    for start, stop in slices:
        text = b"".join(bytes(piece) for piece in fast.listed(start, stop))
        assert text == _joined(ordered[start:stop])
        assert text == b"".join(bytes(piece) for piece in arrow.listed(start, stop))


@pytest.mark.parametrize("keep_all", [True, False])
def test_messages_of_short_ids_are_those_of_the_general_path(monkeypatch, keep_all):
    """A chunk of a range roster's ids in text order with two steps, all its reports or some:
    the same messages (step, partition, reports, bytes) as with every key's words gathered and
    the ids joined by Arrow."""
    size = 30_000
    dep = parse_config(range_config(size))
    ids = sorted(f"u{i}" for i in range(size))
    rng = np.random.default_rng(6)
    chunk = Columns(
        100,
        strings(ids),
        rng.integers(1, 3, size).astype(np.int64),
        {"poverty": rng.integers(0, 2, size).astype(np.int64)},
    )
    keep = np.arange(size) if keep_all else np.sort(rng.choice(size, size // 3, replace=False))
    assert chunk.user_words.short

    def made(chunk: Columns) -> list:
        return [
            (b.step, b.partition, b.index.tolist(), b.value)
            for b in chunk_messages(chunk, keep, dep)
        ]

    fast = made(chunk)
    with monkeypatch.context() as m:
        m.setattr(key_words, "SHORT", 0)
        m.setattr(upload_messages, "_joined_inline", lambda words, order: None)
        general = made(Columns(chunk.start, chunk.users, chunk.steps, chunk.codes))
    assert fast == general and len(fast) >= 2 * dep.topics.partitions
    listed = [i for _, _, index, _ in fast for i in index]
    assert sorted(listed) == (keep + chunk.start).tolist()
    first = fast[0]
    users = chunk.users.take(int64s(np.array(first[2]) - chunk.start)).to_pylist()
    assert first[3].startswith(b'{"columns":{"user":' + _joined(users))
