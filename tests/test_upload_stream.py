"""The upload streams a file: checked and built a chunk at a time, so its memory is a chunk's and
not the file's; a bad report anywhere (the last chunk too) refuses the whole file; the workers'
verdict on a file sent in many chunks is exact, report by report (`dpstream up`: embedded broker,
Redis, a worker, the releaser)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.cli import N, deployment, dpstream, running  # noqa: F401 - `deployment` is a fixture

from pipeline.config import parse_config
from pipeline.stream.ingest.report_files import ReportFileError
from pipeline.stream.ingest.roster import Roster
from pipeline.upload import read_upload

CONFIG = {
    "name": "upload-stream",
    "roster": {"size": 200_000},
    "horizon": 4,
    "topics": {"partitions": 3},
    "attributes": {
        "poverty": {"type": "binary"},
        "status": {"type": "categorical", "values": ["employed", "unemployed"]},
    },
    "budget": {"rho": 1.0},
    "releases": [{"name": "cu", "type": "cumulative", "attribute": "poverty", "share": 1.0}],
}

# peak memory of a fresh process checking a file and building its messages (one at a time when
# the upload streams them; all at once before): Python and numpy allocations (tracemalloc) plus
# Arrow's (its memory pool's high-water mark)
_PEAK = """
import json, sys, tracemalloc
import pyarrow as pa
from pipeline.config import parse_config
from pipeline.stream.ingest.roster import Roster
from pipeline.upload import read_upload
dep = parse_config(json.loads(sys.argv[1]))
roster = Roster.from_range(dep.n)  # made before the measure: the roster is not the file
tracemalloc.start()
upload = read_upload(sys.argv[2], dep, roster)
for batch in getattr(upload, "messages", lambda: upload.batches)():
    pass
print(tracemalloc.get_traced_memory()[1] + pa.default_memory_pool().max_memory())
"""


def _parquet(path, users: int, steps: int = 1):
    rng = np.random.default_rng(5)
    size = users * steps
    pq.write_table(pa.table({
        "user": pa.array([f"u{i % users}" for i in range(size)]),
        "step": np.arange(size) // users + 1,
        "poverty": rng.integers(0, 2, size),
        "status": pa.array(np.array(["employed", "unemployed"])[rng.integers(0, 2, size)]),
    }), path, row_group_size=4096)  # pyarrow reads a row group whole: the writer's unit
    return path


def _peak_bytes(path, chunk_rows: int) -> int:
    env = {"DPSTREAM_UPLOAD_CHUNK_ROWS": str(chunk_rows), "PATH": os.environ.get("PATH", ""),
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-c", _PEAK, json.dumps(CONFIG), str(path)], env=env,
                         capture_output=True, text=True, check=True, timeout=300).stdout
    return int(out.split()[-1])


def test_the_upload_holds_a_chunk_not_the_file(tmp_path):
    """Before: the whole file was read, coded and turned into messages before the first send
    (~600 MB per 10^6 reports), so memory grew with the file (here by ~19 MB). Now a file 8 times
    longer peaks at the same memory: one chunk, plus a byte per roster user for the repeat check
    (200,000 bytes at either length)."""
    small = _peak_bytes(_parquet(tmp_path / "small.parquet", 20_000), 4096)
    large = _peak_bytes(_parquet(tmp_path / "large.parquet", 160_000), 4096)
    # 140,000 more reports: even 4 bytes each would be 560,000
    assert large - small < 256_000, (small, large)


@pytest.fixture
def dep():
    return parse_config(dict(CONFIG, roster={"size": 1000}))


@pytest.mark.parametrize("suffix", ["csv", "jsonl", "parquet"])
def test_a_bad_report_in_the_last_chunk_refuses_the_whole_file(dep, tmp_path, monkeypatch,
                                                               suffix):
    """The check reads the whole file a chunk at a time: a repeat or a bad value in the last chunk
    stops it as one in the first does, naming the line (CSV, JSONL) or row (Parquet)."""
    monkeypatch.setenv("DPSTREAM_UPLOAD_CHUNK_ROWS", "50")
    users = [f"u{i}" for i in range(1000)] + ["u3"]  # u3 again, in the last chunk
    table = pa.table({"user": users, "step": [1] * 1001, "poverty": [i % 2 for i in range(1001)]})
    path = tmp_path / f"late.{suffix}"
    if suffix == "parquet":
        pq.write_table(table, path)
        words = "row 1001: a second report for user 'u3' at step 1"
    elif suffix == "csv":
        path.write_text("user,step,poverty\n" + "".join(
            f"{r['user']},{r['step']},{r['poverty']}\n" for r in table.to_pylist()))
        words = f"{path}:1002: "
    else:
        path.write_text("".join(json.dumps({"user": r["user"], "step": r["step"], "values": {
            "poverty": r["poverty"]}}) + "\n" for r in table.to_pylist()))
        words = f"{path}:1001: "
    with pytest.raises(ReportFileError) as err:
        read_upload(path, dep, Roster.from_range(1000))
    assert words in str(err.value) and "second report for user 'u3'" in str(err.value)


def _csv(path, step: int, users) -> str:
    path.write_text("user,step,poverty\n" + "".join(f"u{i},{step},{i % 2}\n" for i in users))
    return str(path)


def test_a_file_sent_in_many_chunks_gets_an_exact_verdict(deployment, tmp_path):  # noqa: F811
    """`produce` of files read and sent in chunks of 64 reports: the workers' verdict counts every
    report once (accepted, and rejected by reason), exit 5 on rejections; a bad report in the last
    chunk aborts the upload and the workers take nothing of it (exit 2)."""
    path, env = deployment
    env = dict(env, DPSTREAM_UPLOAD_CHUNK_ROWS="64")
    cfg = ["--config", str(path)]
    order = np.random.default_rng(11).permutation(N)
    with running(path, env, tmp_path):
        half = dpstream("produce", *cfg, "--csv", _csv(tmp_path / "h.csv", 1, range(N // 2)),
                        env=env)
        assert f"{N // 2} accepted, 0 rejected" in half.stdout, half.stdout
        whole = tmp_path / "all.parquet"
        pq.write_table(pa.table({"user": [f"u{i}" for i in order], "step": [1] * N,
                                 "poverty": [int(i % 2) for i in order]}), whole)
        again = dpstream("produce", *cfg, "--parquet", str(whole), env=env, check=False)
        assert again.returncode == 5, (again.stdout, again.stderr)
        assert f"sent {N} reports for step 1 (all acknowledged)" in again.stdout, again.stdout
        assert f"{N // 2} accepted, {N // 2} rejected (duplicate {N // 2})" in again.stdout
        bad = tmp_path / "bad.csv"
        _csv(bad, 2, range(N))
        with bad.open("a") as fh:
            fh.write("nobody,2,1\n")
        refused = dpstream("produce", *cfg, "--csv", str(bad), env=env, check=False)
        # step 2 holds nothing yet: sent in one pass, then aborted at the bad line
        assert refused.returncode == 2, refused.stderr
        assert "the upload was aborted: nothing of the file was accepted" in refused.stderr
        assert f"{bad}:{N + 2}" in refused.stderr and "nobody" in refused.stderr
        status = json.loads(dpstream("status", *cfg, "--json", env=env).stdout)["intake"]
        assert status["open"].get("2", {"reported": 0})["reported"] == 0


def test_a_roster_file_is_looked_up_from_the_columns_bytes(tmp_path, monkeypatch):
    """A roster file (not a range): ids looked up through the roster's id index from the Arrow
    column's bytes, a chunk at a time; an id that is not enrolled is refused naming its row, and
    the messages parse, through the workers' parser, to the same reports."""
    from pipeline.stream.ingest.reports import ReportParser

    monkeypatch.setenv("DPSTREAM_UPLOAD_CHUNK_ROWS", "7")
    ids = [f"h-{i:03d}" for i in range(40)] + ["zoë", 'a"b']
    (tmp_path / "roster.txt").write_text("\n".join(ids) + "\n")
    dep = parse_config(dict(CONFIG, roster={"source": "file", "path": str(tmp_path / "roster.txt")}))
    path = tmp_path / "r.parquet"
    pq.write_table(pa.table({"user": ids[::-1], "step": [2] * len(ids),
                             "poverty": [i % 2 for i in range(len(ids))]}), path)
    upload = read_upload(path, dep)
    assert upload.counts == {2: len(ids)}
    roster = Roster.from_file(tmp_path / "roster.txt")
    parsed = ReportParser(roster, dep.attributes, dep.horizon).parse(
        [b.value for b in upload.messages()])
    assert not parsed.rejections
    got = {(roster.ids[r], int(p)) for r, p in zip(parsed.rows, parsed.codes["poverty"])}
    assert got == {(u, i % 2) for i, u in enumerate(ids[::-1])}
    pq.write_table(pa.table({"user": ids + ["h-040"], "step": [2] * (len(ids) + 1),
                             "poverty": [0] * (len(ids) + 1)}), path)
    with pytest.raises(ReportFileError, match="row 43: unknown_user: user 'h-040' is not enrolled"):
        read_upload(path, dep)


@pytest.mark.parametrize("suffix", ["csv", "jsonl"])
def test_a_text_file_is_read_by_blocks_into_growing_chunks_every_report_once(dep, tmp_path,
                                                                           monkeypatch, suffix):
    """CSV and JSONL are read by blocks of a quarter chunk, grouped into chunks that grow from one
    block (the first reports are checked soon) to about a whole chunk, the file's last blocks one
    by one (little is left to do once the last is decoded), decoded in a thread of their own:
    every report comes once, in the file's order, with its step and code."""
    from pipeline.upload_columns import _csv_reader, _jsonl_reader, arrow_chunks

    monkeypatch.setenv("DPSTREAM_UPLOAD_CHUNK_ROWS", "64")
    rows = [(f"u{i}", 1 + i % 3, i % 2) for i in range(1000)]  # ids of 2 to 4 bytes
    path = tmp_path / f"blocks.{suffix}"
    if suffix == "csv":
        path.write_text("user,step,poverty\n" + "".join(f"{u},{t},{p}\n" for u, t, p in rows))
    else:
        path.write_text("".join(json.dumps({"user": u, "step": t, "values": {"poverty": p}}) + "\n"
                                for u, t, p in rows))
    chunks = list(arrow_chunks(path, suffix, dep))
    sizes = [len(c) for c in chunks]
    assert sum(sizes) == len(rows) and len(chunks) > 4, sizes
    # the first chunk one block, the next two; none past a chunk by more than a block or two
    assert sizes[0] < sizes[1] and max(sizes) < 3 * 64, sizes
    blocks = [b.num_rows for b in (_csv_reader(path, dep) if suffix == "csv" else _jsonl_reader(path))]
    assert sizes[-3:] == blocks[-3:] and max(sizes[:-4]) > max(blocks), (sizes, blocks)
    assert [c.start for c in chunks] == np.cumsum([0, *sizes[:-1]]).tolist()
    got = [(u, int(t), int(p)) for c in chunks
           for u, t, p in zip(c.users.to_pylist(), c.steps, c.codes["poverty"])]
    assert got == rows
