"""`dpstream up` warns once when the workers' backlog grows across consecutive samples, not on a burst."""

from pipeline.stream.local.lag_watch import LagWatch


def test_a_backlog_growing_over_every_interval_is_warned_once_and_again_after_it_shrank():
    watch = LagWatch(samples=3, floor=1_000)
    assert [watch.observe(n) for n in (0, 50_000, 20_000)] == [None, None, None]  # a burst being read
    said = [watch.observe(n) for n in (30_000, 40_000, 60_000)]
    assert said[:2] == [None, None] and "60,000 records not handled, up from 20,000" in said[2]
    assert watch.observe(70_000) is None  # said once while it keeps growing
    assert [watch.observe(n) for n in (10_000, 20_000, 30_000)] == [None, None, None]
    assert "40,000 records not handled" in watch.observe(40_000)  # shrank in between: said again


def test_a_small_growing_backlog_is_not_warned():
    watch = LagWatch(samples=3, floor=1_000)
    assert all(watch.observe(n) is None for n in (10, 20, 30, 40, 50))
