"""The object store's listing index (pipeline/stream/local/object_index.py) pages as S3 does:
checked against the definition — every key starting with the prefix and sorting after the marker, in
order, ``max-keys`` at a time — on random buckets, prefixes and markers (fixed seed)."""

from __future__ import annotations

import random

from pipeline.stream.local.object_index import BucketIndex, ObjectMeta


def _expected(keys: list[str], prefix: str, marker: str, max_keys: int):
    matching = [k for k in sorted(keys) if k.startswith(prefix) and k > marker]
    return matching[:max_keys], max_keys > 0 and len(matching) > max_keys


def test_pages_are_the_keys_after_the_marker_under_the_prefix_in_order():
    rng = random.Random(7)
    folders = ["t/p1/records/", "t/p10/records/", "t/p1/", "t/p2/records/", "", "t/p1/records/x/"]
    keys = sorted(
        {
            rng.choice(folders) + f"{rng.randrange(10**4):05d}{rng.choice(['.batch', '', 'é'])}"
            for _ in range(600)
        }
    )
    index = BucketIndex()
    for key in keys:
        index.put(key, ObjectMeta(1, 0.0, "e"))
    prefixes = [
        "",
        "t/",
        "t/p1",
        "t/p1/",
        "t/p1/records/",
        "t/p1/records/000",
        "t/p1/records/x/",
        "t/p2/records/01",
        "t/p3/",
        "0",
        "t/p1/records/\U0010ffff",
    ]
    for _ in range(400):
        prefix = rng.choice(prefixes)
        marker = rng.choice(["", rng.choice(keys), rng.choice(keys)[:-1], "t/p1/records/05", "u"])
        max_keys = rng.choice([0, 1, 7, 1000])
        page = index.page(prefix, "", marker, False, max_keys)
        expected, truncated = _expected(keys, prefix, marker, max_keys)
        assert [k for k, _ in page.contents] == expected, (prefix, marker, max_keys)
        assert page.truncated == truncated, (prefix, marker, max_keys)
        assert page.last_entry == ("K:" + expected[-1] if expected else ""), (prefix, marker)

    # a deleted key leaves every page it was on
    gone = [k for k in keys if k.startswith("t/p1/records/0")][:50]
    for key in gone:
        index.remove(key)
    remaining = [k for k in keys if k not in set(gone)]
    page = index.page("t/p1/records/", "", "", False, 1000)
    assert [k for k, _ in page.contents] == _expected(remaining, "t/p1/records/", "", 1000)[0]


def test_a_rendered_entry_is_kept_until_the_object_changes():
    index = BucketIndex()
    index.put("a/b", ObjectMeta(1, 0.0, "e1"))
    calls = []

    def render(key: str, meta: ObjectMeta) -> str:
        calls.append(key)
        return f"{key}:{meta.etag}"

    meta = index.page("a/", "", "", False, 10).contents[0][1]
    assert index.rendered("a/b", meta, render) == "a/b:e1"
    assert index.rendered("a/b", meta, render) == "a/b:e1" and calls == ["a/b"]
    index.put("a/b", ObjectMeta(2, 1.0, "e2"))  # overwritten: rendered again
    meta = index.page("a/", "", "", False, 10).contents[0][1]
    assert index.rendered("a/b", meta, render) == "a/b:e2" and calls == ["a/b", "a/b"]
