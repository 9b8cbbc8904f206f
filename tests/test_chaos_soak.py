"""A short seeded chaos soak (jobs/eval/chaos_soak.py) on a real `dpstream up`: kill -9 and SIGSTOP of
its processes and of `up` itself while steps are produced, closed and released; the checker then finds
every acknowledged report counted once (the public panels equal the batch run over every report), one
value per public key, one ledger entry per release and step, no stall and, after `down`, no process
of any `up` of the run left. The long run and its figures: docs/streaming.md, "Chaos soak"."""

from __future__ import annotations

import subprocess  # noqa: F401 - the soak starts processes: tests/conftest.py hands such files out first

from jobs.eval.chaos_soak import Soak


def test_short_chaos_soak_keeps_every_promise(tmp_path):
    result = Soak(tmp_path, n=300, horizon=3, seed=3, fault_every=12.0, stall=180.0, max_faults=4).run()
    assert result["problems"] == [], result
    assert result["fault_total"] == 4 and result["up_starts"] >= 2, result  # the seed kills `up` once
