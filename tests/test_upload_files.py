"""Reading report files for the fast upload (pipeline.upload): the messages say what the per-report
path says, bad files are refused whole with the per-report checker's words, deadlines are checked.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.config import parse_config
from pipeline.stream.ingest.murmur import partitions_of
from pipeline.stream.ingest.report_files import ReportFileError, read_report_file
from pipeline.stream.ingest.reports import ReportParser
from pipeline.stream.ingest.roster import Roster, murmur2_partition
from pipeline.upload import read_upload
from pipeline.upload_time import UPLOAD_SECONDS_PER_MILLION, deadline_warning

N = 8
CONFIG = {
    "name": "upload-files",
    "roster": {"size": N},
    "horizon": 4,
    "topics": {"partitions": 3},
    "attributes": {
        "poverty": {"type": "binary"},
        "status": {"type": "categorical", "values": ["employed", "unemployed"]},
        "item": {"type": "hashed", "size": 100},
    },
    "budget": {"rho": 1.0},
    "releases": [{"name": "cu", "type": "cumulative", "attribute": "poverty", "share": 1.0}],
}


@pytest.fixture(scope="module")
def dep():
    return parse_config(CONFIG)


def _parsed(dep, messages):
    return ReportParser(Roster.from_range(N), dep.attributes, dep.horizon).parse(messages)


def _by_report(dep, parsed) -> dict[tuple[int, int], tuple]:
    return {
        (int(r), int(s)): tuple(int(parsed.codes[a][i]) for a in dep.attributes)
        for i, (r, s) in enumerate(zip(parsed.rows, parsed.steps))
    }


def test_a_csv_and_jsonl_upload_says_what_the_per_report_path_says(dep, tmp_path):
    csv = tmp_path / "ok.csv"  # pandas spellings, gaps, labels, a hashed string and a hashed id
    csv.write_text(
        "user,step,poverty,status,item\nu0,1,1.0,employed,abc\nu1,1,0.0,,7\nu2,1,True,unemployed,\n"
        "u3,2,,employed,\nu4,2, 1 ,,x y\n"
    )
    jsonl = tmp_path / "ok.jsonl"
    jsonl.write_text(
        "\n".join(
            orjson.dumps(r).decode()
            for r in read_report_file(csv, dep, Roster.from_range(N)).reports
        )
        + "\n"
    )
    for path in (csv, jsonl):
        slow = read_report_file(path, dep, Roster.from_range(N))
        upload = read_upload(path, dep, Roster.from_range(N))
        reference = _parsed(dep, [orjson.dumps(r) for r in slow.reports])
        fast = _parsed(dep, [b.value for b in upload.batches])
        assert not fast.rejections and _by_report(dep, fast) == _by_report(dep, reference)
        assert upload.counts == {1: 3, 2: 2} and upload.first_lines == (
            {1: 2, 2: 5} if path == csv else {1: 1, 2: 4}
        )
        assert all(b.value.startswith(b'{"columns":') for b in upload.batches)


def test_a_parquet_files_dictionary_columns_with_nulls_say_what_the_per_report_path_says(
    dep, tmp_path
):
    """Parquet text columns are read as dictionaries and coded by a take of the coded
    dictionary: a null is missing and a value outside the domain is refused, as the workers'
    parser decodes each report."""
    status = ["employed", None, "unemployed", "employed", None, "unemployed", "employed", None]
    poverty = ["1", "0", None, "yes", "true", "0", None, "1"]

    def written(poverty: list) -> tuple:
        path = tmp_path / "dictionary.parquet"
        columns = {"status": status, "poverty": poverty}
        pq.write_table(
            pa.table(
                {
                    "user": [f"u{i}" for i in range(N)],
                    "step": [1] * N,
                    **{name: pa.array(c).dictionary_encode() for name, c in columns.items()},
                }
            ),
            path,
        )
        reports = [
            {
                "user": f"u{i}",
                "step": 1,
                "values": {k: c[i] for k, c in columns.items() if c[i] is not None},
            }
            for i in range(N)
        ]
        return path, _parsed(dep, [orjson.dumps(r) for r in reports])

    path, reference = written(poverty)
    assert reference.rejections  # "yes" is outside the binary domain: the file is refused whole
    with pytest.raises(ReportFileError, match="row 4: value 'yes' of 'poverty'"):
        read_upload(path, dep, Roster.from_range(N))
    path, reference = written(["1" if v == "yes" else v for v in poverty])
    fast = _parsed(dep, [b.value for b in read_upload(path, dep, Roster.from_range(N)).batches])
    assert not reference.rejections and not fast.rejections
    assert _by_report(dep, fast) == _by_report(dep, reference)


def test_batches_go_to_the_murmur2_owner_of_their_users(dep, tmp_path):
    users = [f"u{i}" for i in range(N)]
    path = tmp_path / "all.parquet"
    pq.write_table(
        pa.table({"user": users, "step": [1] * N, "poverty": [i % 2 for i in range(N)]}), path
    )
    upload = read_upload(path, dep, Roster.from_range(N))
    assert sum(b.index.size for b in upload.batches) == N
    for batch in upload.batches:
        for user in orjson.loads(batch.value)["columns"]["user"]:
            assert murmur2_partition(user.encode(), 3) == batch.partition


def test_vectorised_murmur2_is_kafkas(dep):
    rng = np.random.default_rng(0)
    alphabet = list("az09_-é€😀")
    keys = ["".join(rng.choice(alphabet, size=rng.integers(0, 20))) for _ in range(3000)]
    for partitions in (1, 3, 16):
        assert partitions_of(keys, partitions).tolist() == [
            murmur2_partition(k.encode(), partitions) for k in keys
        ]


def test_a_parquet_file_with_a_values_struct_or_mixed_jsonl_is_read(dep, tmp_path):
    nested = tmp_path / "nested.parquet"
    pq.write_table(
        pa.table(
            {
                "user": ["u1", "u2"],
                "step": [3, 3],
                "values": [
                    {"poverty": True, "status": None},
                    {"poverty": None, "status": "employed"},
                ],
            }
        ),
        nested,
    )
    parsed = _parsed(dep, [b.value for b in read_upload(nested, dep, Roster.from_range(N)).batches])
    assert _by_report(dep, parsed) == {(1, 3): (1, -1, -1), (2, 3): (-1, 0, -1)}
    mixed = tmp_path / "mixed.jsonl"  # a label on one line, a code on the next: not one Arrow table
    mixed.write_text(
        '{"user":"u0","step":1,"values":{"status":"unemployed"}}\n{"user":"u1","step":1,"values":'
        '{"status":0}}\n'
    )
    parsed = _parsed(dep, [b.value for b in read_upload(mixed, dep, Roster.from_range(N)).batches])
    assert _by_report(dep, parsed) == {(0, 1): (-1, 1, -1), (1, 1): (-1, 0, -1)}


@pytest.mark.parametrize(
    "text, words",
    [
        (
            "user,step,poverty\nu0,1,1\nu0,1,0\n",
            ":3: column 1 ('user'): a second report for user 'u0' at step 1",
        ),
        ("user,step,poverty\nu0,1,1\nu9,1,0\n", ":3: column 1 ('user'): unknown_user"),
        ("user,step,poverty\nu0,1,7\n", ":2: column 3 ('poverty'): out_of_domain"),
        ("user,step,povrety\nu0,1,1\n", ":1: column 3 ('povrety'): unknown column"),
        ("user,step,poverty\nu0,x,1\n", ":2: column 2 ('step'): step 'x' is not an integer"),
    ],
)
def test_a_bad_csv_is_refused_whole_naming_line_and_column(dep, tmp_path, text, words):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(ReportFileError) as err:
        read_upload(path, dep, Roster.from_range(N))
    assert words in str(err.value)


@pytest.mark.parametrize(
    "table, words",
    [
        (
            {"user": ["u0", "u0"], "step": [2, 2], "poverty": [1, 0]},
            "row 2: a second report for user 'u0' at step 2",
        ),
        (
            {"user": ["u0", "u1"], "step": [2, 2], "poverty": [1, 5]},
            "row 2: value 5 of 'poverty' is outside its domain",
        ),
        ({"user": ["u0", "zz"], "step": [2, 2], "poverty": [1, 0]}, "row 2: unknown_user"),
        ({"user": ["u0"], "step": [9], "poverty": [1]}, "row 1: step outside 1..4"),
        ({"user": ["u0"], "step": [1], "height": [1]}, "unknown columns ['height']"),
    ],
)
def test_a_bad_parquet_file_is_refused_whole_naming_the_row(dep, tmp_path, table, words):
    path = tmp_path / "bad.parquet"
    pq.write_table(pa.table(table), path)
    with pytest.raises(ReportFileError) as err:
        read_upload(path, dep, Roster.from_range(N))
    assert words in str(err.value)


def test_plan_warns_when_the_deadline_is_shorter_than_a_steps_upload(tmp_path):
    n = 500_000
    need = UPLOAD_SECONDS_PER_MILLION * n / 1e6
    cfg = {
        **CONFIG,
        "roster": {"size": n},
        "steps": {"close": "deadline", "deadline_seconds": need / 2},
    }
    assert "shorter than the planned upload" in deadline_warning(parse_config(cfg))
    assert (
        deadline_warning(
            parse_config({**cfg, "steps": {"close": "deadline", "deadline_seconds": need * 2}})
        )
        is None
    )
    assert deadline_warning(parse_config({**cfg, "steps": {"close": "control"}})) is None
    path = tmp_path / "deadline.yaml"
    path.write_text(yaml.safe_dump(cfg))
    proc = subprocess.run(
        [sys.executable, "-m", "pipeline.cli", "plan", "--config", str(path)],
        capture_output=True,
        text=True,
        env=dict(os.environ, DPSTREAM_HOME=str(tmp_path / "home")),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "WARNING: steps.deadline_seconds" in proc.stderr
        and "shorter than the planned upload" in proc.stderr
    )


def test_lines_are_counted_past_blank_lines_and_quoted_line_breaks(dep, tmp_path):
    path = tmp_path / "gaps.csv"
    path.write_text('user,step,poverty,item\n\nu0,1,1,"x\ny"\nu1,2,0,z\n')
    upload = read_upload(path, dep, Roster.from_range(N))
    # as the per-report checker counts: a record with a line break is named by its last line
    assert upload.first_lines == {1: 4, 2: 5} and upload.line_of(1) == 5
    jsonl = tmp_path / "gaps.jsonl"
    jsonl.write_text('\n{"user":"u0","step":1,"values":{"poverty":1}}\n\n{"user":"u1","step":1,"values":{}}\n')
    with pytest.raises(ReportFileError) as err:
        read_upload(jsonl, dep, Roster.from_range(N))
    assert f"{jsonl}:4:" in str(err.value)


def test_a_csv_step_with_spaces_or_a_plus_sign_is_that_step(dep, tmp_path):
    """The CSV reader reads the step as an integer (spaces around it allowed); a cell it does
    not take ("+2") sends the file to the per-report reader, which reads it as int() does: either
    way the step is 2, not an error."""
    for cells in ([" 2", "2 "], ["+2", "2"]):
        path = tmp_path / "steps.csv"
        path.write_text("user,step,poverty\n" + "".join(f"u{i},{c},1\n" for i, c in enumerate(cells)))
        assert read_upload(path, dep, Roster.from_range(N)).counts == {2: 2}
