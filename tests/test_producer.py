"""The producers' end without a broker: the reports JSON Schema, the helper's validation with the
workers' own parser, BOM-prefixed files, the dead-letter summary and the progress line."""

from __future__ import annotations

import io
from types import SimpleNamespace

import jsonschema
import pytest

from pipeline.config import parse_config
from pipeline.dead_letters import format_summary, summarise
from pipeline.producer import ReportRejected, ReportSender, progress_printer
from pipeline.schemas import load_schema
from pipeline.stream.ingest.report_files import read_report_file
from pipeline.stream.ingest.roster import Roster


@pytest.fixture
def dep():
    return parse_config({
        "name": "producers", "roster": {"size": 10}, "horizon": 3, "budget": {"rho": 1.0},
        "attributes": {"poverty": {"type": "binary"}, "job": {"type": "categorical", "values": ["nurse", "cook"]}},
        "releases": [{"name": "c", "type": "cumulative", "attribute": "poverty", "share": 1.0}],
    })


def test_reports_schema_accepts_the_three_forms_and_names_what_is_wrong():
    check = jsonschema.Draft202012Validator(load_schema("reports", "value"))
    good = [{"user": "u1", "step": 2, "values": {"poverty": 1, "job": "nurse"}},
            {"user": "u1", "step": 2, "values": {"poverty": None}},
            {"reports": [{"user": "u1", "step": 1, "values": {"poverty": True}}]},
            {"columns": {"user": ["u1", "u2"], "step": 3, "poverty": [0, 1]}},
            {"columns": {"user": ["u1", "u2"], "step": [1, 2], "job": ["nurse", None]}}]
    for report in good:
        check.validate(report)
    for bad in ({"user": "u1", "step": 0, "values": {}}, {"user": "u1", "values": {"poverty": 1}},
                {"user": "u1", "step": 1, "values": {"poverty": 1}, "extra": 1}, {"reports": [{"user": 3}]},
                {"columns": {"user": ["u1"]}}):
        assert not check.is_valid(bad), bad


def test_sender_validates_with_the_workers_parser(dep):
    sender = ReportSender(dep, "127.0.0.1:9")  # no connection until something is sent
    sender.validate([{"user": "u0", "step": 1, "values": {"poverty": 1, "job": "cook"}}])
    with pytest.raises(ReportRejected, match="report 1: unknown_user"):
        sender.validate([{"user": "u0", "step": 1, "values": {"poverty": 1}},
                         {"user": "nobody", "step": 1, "values": {"poverty": 1}}])
    with pytest.raises(ReportRejected, match="report 0: out_of_domain") as err:
        sender.validate([{"user": "u0", "step": 1, "values": {"job": "pilot"}}])
    assert err.value.index == 0 and err.value.reason == "out_of_domain"
    with pytest.raises(ReportRejected, match="report 1: duplicate"):
        sender.validate([{"user": "u0", "step": 1, "values": {"poverty": 1}},
                         {"user": "u0", "step": 1, "values": {"poverty": 0}}])


def test_byte_order_marked_files_are_accepted(dep, tmp_path):
    """Excel's "CSV UTF-8" starts with a BOM; before, the header read as '\\ufeffuser', an unknown column."""
    roster = Roster.from_config(dep.roster)
    csv_path = tmp_path / "excel.csv"
    csv_path.write_bytes("user,step,poverty,job\nu0,1,1,nurse\nu1,1,0,cook\n".encode("utf-8-sig"))
    found = read_report_file(csv_path, dep, roster)
    assert [r["user"] for r in found.reports] == ["u0", "u1"] and found.reports[0]["values"] == {"poverty": 1,
                                                                                                "job": "nurse"}
    jsonl = tmp_path / "bom.jsonl"
    jsonl.write_bytes(b'\xef\xbb\xbf{"user": "u2", "step": 1, "values": {"poverty": 1}}\n')
    assert read_report_file(jsonl, dep, roster).reports == [{"user": "u2", "step": 1, "values": {"poverty": 1}}]


def test_dead_letters_are_summarised_by_reason():
    def letter(reason, offset, detail="d"):
        return SimpleNamespace(headers=[("dpstream-reason", reason.encode()), ("dpstream-detail", detail.encode()),
                                        ("dpstream-source", f"t/0/{offset}".encode())])

    summary = summarise([letter("malformed", 1, "not JSON"), letter("late", 2), letter("malformed", 3, "values")],
                        examples=1)
    assert list(summary) == ["malformed", "late"] and summary["malformed"].count == 2
    assert (summary["malformed"].first_source, summary["malformed"].last_source) == ("t/0/1", "t/0/3")
    text = format_summary(summary, "dpstream.x.dead-letter")
    assert "3 rejected report(s)" in text and "e.g. not JSON" in text
    assert format_summary({}, "x") == "x: no rejected reports"


def test_progress_line_only_for_long_operations():
    out = io.StringIO()
    quick = progress_printer("acknowledged", " reports", every=60.0, stream=out)
    for i in range(1, 4):
        quick(i, 3)
    assert out.getvalue() == ""  # done within the interval: nothing printed
    slow = progress_printer("acknowledged", " reports", every=0.0, stream=out)
    slow(5, 10)
    assert out.getvalue() == "acknowledged: 5 of 10 reports\n"
