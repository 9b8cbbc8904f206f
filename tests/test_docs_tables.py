"""The generated calibration tables of docs/monitors.md match what the code computes now."""

from pathlib import Path

from jobs.eval import monitors_table

DOC = Path(__file__).resolve().parents[1] / "docs" / "monitors.md"


def test_monitors_doc_tables_match_the_code():
    text = DOC.read_text()
    assert monitors_table.stale_blocks(text) == []
    # and the check notices a drift: a changed τ in the table is reported stale
    tau = monitors_table.heavy_hitters_table().splitlines()[3].rsplit("|", 2)[1].strip()
    drifted = text.replace(f"| {tau} |", "| 1 833 |", 1)
    assert monitors_table.stale_blocks(drifted) == ["heavy-hitters-table"]


def test_check_mode_exit_codes(tmp_path):
    stale = tmp_path / "monitors.md"
    end = "<!-- /generated:heavy-hitters-table -->"
    stale.write_text(DOC.read_text().replace(end, "x\n" + end))
    assert monitors_table.main(["--check", str(stale)]) == 1
    assert monitors_table.main(["--write", str(stale)]) == 0
    assert monitors_table.main(["--check", str(stale)]) == 0
