"""The analyst page (``dpstream report``) in a real headless browser (Debian's chromium, installed by
scripts/install-chromium.sh from `make test`): the page renders its plots with no network, and the
labels and numbers read back from the rendered DOM are the releases' answers."""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest

from analyst_support import N, T, analyst_config, panels, released_store
from pipeline.analyst.reader import PublicReader
from pipeline.analyst.report import write_report
from pipeline.config import parse_config


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.fail("no chromium on PATH: `make test` installs it (scripts/install-chromium.sh)")


def rendered_dom(page) -> str:
    """The DOM after the page's scripts ran, as chromium serialises it. The network is cut off
    (an unreachable proxy for every request), so anything fetched from outside would fail to load."""
    proc = subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=10000",
                           "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>", "--dump-dom",
                           page.as_uri()], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


class _Tables(HTMLParser):
    """The text of every table cell, per table class."""

    def __init__(self):
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._table, self._row, self._cell = None, None, None

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self._table = self.tables.setdefault(dict(attrs).get("class", ""), [])
        elif tag == "tr" and self._table is not None:
            self._row = []
            self._table.append(self._row)
        elif tag in ("td", "th") and self._row is not None:
            self._cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._row.append(self._cell.strip())
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    dep = parse_config(analyst_config())
    poverty, occupation = panels()
    reader = PublicReader(dep, released_store(dep, {"poverty": poverty, "occupation": occupation}))
    return reader, write_report(reader, tmp_path_factory.mktemp("report"))


def test_report_is_self_contained(page):
    _, path = page
    html = path.read_text()
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=\"?(https?:)?//", html), "fetches from the network"
    assert "Plotly" in html  # plotly.js is inlined


def test_report_renders_and_reads_back_labels_and_numbers(page):
    reader, path = page
    dom = rendered_dom(path)
    # the plots rendered: plotly drew its SVGs, with the public labels in the legends and axis titles
    assert dom.count('class="main-svg"') >= 4, "plotly did not render (no network needed: the JS is inline)"
    for label in ("poor in all 3 months (111)", "poor in at least 2 months so far", "share of n (%)", "ε spent",
                  "nurse"):
        assert label in dom, label
    tables = _Tables()
    tables.feed(dom)
    # the window release's latest step: every row's label, estimate and share, as the release answers it
    rows = tables.tables["answer"]
    answer = reader.answer("poverty-quarterly", T)
    window = rows[1:1 + len(answer.rows)]
    assert [r[0] for r in window] == [r.label for r in answer.rows]
    for cells, r in zip(window, answer.rows):
        assert cells[1] == f"{r.estimate:,.0f}" and cells[3] == f"{100 * r.estimate / N:.2f}%"
    # the privacy spend per step, ending at the planned total (every step released)
    spend = tables.tables["spend"][1:]
    assert [int(r[0]) for r in spend] == list(range(1, T + 1))
    assert float(spend[-1][1]) == pytest.approx(reader.spend()[-1]["epsilon"], abs=1e-4) and spend[-1][3] == "100.0%"
    # the alerts timeline: nurse at steps 1 and 2, its users' flags then spent
    alerts = tables.tables["alerts"][1:]
    assert "nurse" in alerts[0][1] and "flags are now spent" in alerts[1][1] and alerts[2][1] == "no value flagged"
    # the words an analyst needs: padding removed and why, which bound, what a flag means and why flags run out
    for text in ("Padding removed", "Bun, Gaboardi, Neunhoeffer, Zhang", "Why flags run out", "What a flag means",
                 "Does not answer"):
        assert text in dom, text


LINK = '<a href="https://attacker.example/x">poor</a>'


@pytest.fixture(scope="module")
def linked_page(tmp_path_factory):
    """The page of a configuration whose labels carry markup: the binary attribute's label, a
    dictionary
    entry (the alerts' ticks) and the step unit (axis titles)."""
    cfg = analyst_config()
    cfg["attributes"]["poverty"]["label"] = LINK
    cfg["attributes"]["occupation"]["dictionary"][7] = LINK.replace("poor", "nurse")
    cfg["steps"]["unit"] = "<b>month</b>"
    dep = parse_config(cfg)
    poverty, occupation = panels()
    reader = PublicReader(dep, released_store(dep, {"poverty": poverty, "occupation": occupation}))
    return write_report(reader, tmp_path_factory.mktemp("linked"))



def test_configuration_labels_render_as_text_in_the_plots(linked_page):
    """Plotly renders a subset of HTML in legend entries, titles and tick labels: a configuration
    label with
    ``<a href>`` was a live link there (and ``<b>`` bold). Rendered by chromium, the legends and
    the alerts'
    ticks show the label's characters, and no SVG link or bold span comes from the configuration."""
    dom = rendered_dom(linked_page)
    assert dom.count('class="main-svg"') >= 4, "plotly did not render"
    assert not re.search(r"<a\b[^>]*attacker\.example", dom), "a label became a live link"
    assert '<tspan style="font-weight:bold">' not in dom, "a label's <b> was rendered as markup"
    legends = re.findall(r'<text class="legendtext"[^>]*>(.*?)</text>', dom)
    poor = '&lt;a href="https://attacker.example/x"&gt;poor&lt;/a&gt;'
    assert legends and all(t.startswith(poor) for t in legends if "attacker" in t), legends
    assert any(t.startswith(poor) and "&lt;b&gt;month&lt;/b&gt;" in t for t in legends), legends
    ticks = [t for t in re.findall(r'<g class="ytick">.*?>([^<>]*)</text>', dom) if "nurse" in t]
    assert ticks == ['&lt;a href="https://attacker.example/x"&gt;nurse&lt;/a&gt;'], ticks
