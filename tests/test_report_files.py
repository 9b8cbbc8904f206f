"""Report files for `dpstream produce`: checked as a whole, errors name file, line and column."""

from __future__ import annotations

import orjson
import pytest

from pipeline.config import parse_config
from pipeline.stream.ingest.report_files import ReportFileError, check_report_file, read_report_file
from pipeline.stream.ingest.roster import Roster

N = 6


@pytest.fixture(scope="module")
def dep():
    return parse_config({
        "name": "files", "roster": {"size": N}, "horizon": 4,
        "attributes": {"poverty": {"type": "binary"},
                       "status": {"type": "categorical", "values": ["employed", "unemployed"]}},
        "budget": {"rho": 1.0},
        "releases": [{"name": "cu", "type": "cumulative", "attribute": "poverty", "share": 1.0}],
    })


def _read(dep, path):
    return read_report_file(path, dep, Roster.from_range(N))


def _error(dep, path) -> str:
    with pytest.raises(ReportFileError) as err:
        _read(dep, path)
    return str(err.value)


def test_good_csv_and_jsonl_with_pandas_values(dep, tmp_path):
    csv = tmp_path / "ok.csv"
    # what DataFrame.to_csv writes: floats for a column with gaps, True/False for bools
    csv.write_text("user,step,poverty,status\nu0,1,1.0,employed\nu1,1,0.0,\nu2,1,True,unemployed\nu3,2,,employed\n")
    found = _read(dep, csv)
    assert found.lines == [2, 3, 4, 5]
    assert [r["values"] for r in found.reports] == [{"poverty": "1.0", "status": "employed"}, {"poverty": "0.0"},
                                                    {"poverty": "True", "status": "unemployed"}, {"status": "employed"}]
    assert found.steps() == {1, 2} and found.only_step(2).lines == [5]
    jsonl = tmp_path / "ok.jsonl"
    jsonl.write_text("\n".join(orjson.dumps(r).decode() for r in found.reports) + "\n\n")
    assert _read(dep, jsonl).reports == found.reports


def test_csv_header_with_a_misspelt_attribute(dep, tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("user,step,povrety\nu0,1,1\n")
    msg = _error(dep, path)
    assert msg.startswith(f"{path}:1: column 3 ('povrety'): unknown column 'povrety'") and "did you mean 'poverty'" in msg


@pytest.mark.parametrize("row, line, column, words", [
    ("u3,x,1", 5, "2 ('step')", "step 'x' is not an integer"),
    ("u3,9,1", 5, "2 ('step')", "future_step"),
    ("u3,0,1", 5, "2 ('step')", "malformed"),
    ("u3,1,2", 5, "3 ('poverty')", "out_of_domain"),
    ("nobody,1,1", 5, "1 ('user')", "unknown_user"),
    ("u0,1,0", 5, "1 ('user')", "first on line 2"),
])
def test_csv_bad_row_names_line_and_column(dep, tmp_path, row, line, column, words):
    path = tmp_path / "rows.csv"
    path.write_text("user,step,poverty\nu0,1,1\nu1,1,0\nu2,1,1\n" + row + "\nu4,1,1\n")
    msg = _error(dep, path)
    assert msg.startswith(f"{path}:{line}: column {column}: ") and words in msg, msg


def test_jsonl_bad_line_names_line_and_column(dep, tmp_path):
    path = tmp_path / "bad.jsonl"
    good = orjson.dumps({"user": "u0", "step": 1, "values": {"poverty": 1}}).decode()
    path.write_text(good + "\n\n" + '{"user": "u1", "step": 1, "values": {"poverty": 1}' + "\n")
    msg = _error(dep, path)
    assert msg.startswith(f"{path}:3: column ") and "not JSON" in msg
    path.write_text(good + "\n" + '{"user": "u1", "step": 1, "values": {"poverty": 0.5}}' + "\n")
    msg = _error(dep, path)
    assert msg.startswith(f"{path}:2: column 38: out_of_domain"), msg  # column of "poverty" on that line
    path.write_text(good + "\n" + '{"user": "u1", "step": "2", "values": {"poverty": 1}}' + "\n")
    assert _error(dep, path).startswith(f"{path}:2: column 16: malformed")
    path.write_text('{"reports": []}\n')
    assert "each line must be one report" in _error(dep, path)



def test_a_large_file_is_checked_and_read_in_bounded_memory(tmp_path):
    """200,000 reports: checking them, then reading them again for the send, holds one chunk, not the file.

    The bound, from tracemalloc peaks measured on this file: the reader before (whole file, then the
    parser over all of it) peaked at ~990 MB (orjson's bytes keep a ~4 kB buffer each); merely holding
    the 200,000 report dicts takes ~94 MB (``holding`` below). The chunked check peaks at ~14 MB (one
    chunk of 10,000 reports, the parser's arrays for it, a byte per roster row for the step) and the
    second read at ~13 MB. 25 MB leaves room for allocator noise and is under a third of ``holding``:
    any reader keeping the file's reports fails it."""
    import tracemalloc

    n = 200_000
    big = parse_config({
        "name": "big", "roster": {"size": n}, "horizon": 2, "attributes": {"poverty": {"type": "binary"}},
        "budget": {"rho": 1.0}, "releases": [{"name": "cu", "type": "cumulative", "attribute": "poverty",
                                              "share": 1.0}],
    })
    roster = Roster.from_range(n)
    roster.index()  # the roster's own lookup index is the deployment's, built once, not the file's
    path = tmp_path / "big.jsonl"
    with path.open("wb") as fh:
        for i in range(n):
            fh.write(b'{"user": "u%d", "step": 1, "values": {"poverty": %d}}\n' % (i, i % 2))
    bound = 25 * 2**20

    tracemalloc.start()
    try:
        checked = check_report_file(path, big, roster)
        _, checking = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        sent = sum(1 for _ in checked.reports())
        _, reading = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        whole = read_report_file(path, big, roster)  # the in-memory reader, for the bound's comparison
        _, holding = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(checked) == sent == len(whole.reports) == n and checked.first_lines == {1: 1}
    assert checking < bound and reading < bound, (checking, reading)
    assert holding > 2 * bound, holding  # what holding the file's reports costs: the bound would catch it
    del whole

    # a repeat far apart (different chunks) is still found, naming both lines
    with path.open("ab") as fh:
        fh.write(b'{"user": "u7", "step": 1, "values": {"poverty": 1}}\n')
    with pytest.raises(ReportFileError, match=rf"{path}:{n + 1}: column 2: a second report for user 'u7' at step 1 "
                                              r"\(first on line 8\)"):
        check_report_file(path, big, roster)


def test_checked_file_is_read_again_by_step_and_refused_once_changed(dep, tmp_path):
    """Chunks of 2 reports: repeats and bad lines across chunks, per-step counts and first lines, the second read."""
    path = tmp_path / "steps.csv"
    path.write_text("user,step,poverty\nu0,2,1\nu1,1,0\nu2,2,1\nu3,1,1\nu4,2,0\n")
    checked = check_report_file(path, dep, Roster.from_range(N), chunk=2)
    assert (checked.counts, checked.first_lines, len(checked)) == ({2: 3, 1: 2}, {2: 2, 1: 3}, 5)
    two = checked.only_step(2)
    assert [lines for _, lines in two.chunks(size=2)] == [[2], [4], [6]] and len(two) == 3
    assert [r["user"] for r in two.reports()] == ["u0", "u2", "u4"] and two.line_of(2) == 6
    assert len(checked.only_step(3)) == 0 and list(checked.only_step(3).reports()) == []
    # a bad line in a later chunk than a repeat: the earlier line is named; the repeat's first line across chunks
    path.write_text("user,step,poverty\nu0,1,1\nu1,1,0\nu2,1,1\nu0,1,1\nu4,1,2\n")
    with pytest.raises(ReportFileError, match=rf"{path}:5: column 1 \('user'\): .*first on line 2"):
        check_report_file(path, dep, Roster.from_range(N), chunk=2)
    path.write_text("user,step,poverty\nu0,1,1\nu1,1,0\nu2,1,3\nu0,1,1\n")
    with pytest.raises(ReportFileError, match=rf"{path}:4: column 3 \('poverty'\): out_of_domain"):
        check_report_file(path, dep, Roster.from_range(N), chunk=3)
    # changed after the check: the send's read refuses it
    path.write_text("user,step,poverty\nu0,1,1\n")
    checked = check_report_file(path, dep, Roster.from_range(N))
    path.write_text("user,step,poverty\nu0,1,1\nu1,1,1\n")
    with pytest.raises(ReportFileError, match="changed after it was checked"):
        list(checked.reports())
