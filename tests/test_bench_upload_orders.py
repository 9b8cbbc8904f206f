"""The upload benchmark's file orders (jobs/bench/bench_upload.py ``--order``): the roster's ids in
row order (ids of one length chunk after chunk), as text (a database's ORDER BY of a text id: ids
of several lengths side by side everywhere) or shuffled; each is the roster's ids, each once."""

from __future__ import annotations

from jobs.bench.bench_upload import ORDERS


def test_each_order_holds_every_id_once_in_its_own_order():
    ids = [f"u{i}" for i in range(1200)]
    numeric, text, shuffled = (ORDERS[k](list(ids)) for k in ("numeric", "text", "shuffled"))
    assert numeric == ids
    assert sorted(text) == sorted(shuffled) == sorted(ids)
    assert text[:4] == ["u0", "u1", "u10", "u100"]  # lengths mixed from the first ids on
    assert len({len(u) for u in text[:200]}) == 4
    assert shuffled not in (ids, text)
    assert ORDERS["shuffled"](list(ids)) == shuffled  # the same file run after run
