"""The analysts' readers (pipeline.analyst) on a deployment released in-process: labelled answers
with the mechanism's own intervals and shares of n, the exports' data dictionary and padding flags,
alerts in words, plan in words. Everything is read from the public records only (a PanelStore)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow.parquet as pq
import pytest

from analyst_support import N, T, analyst_config, panels, released_store
from pipeline.analyst.export import METADATA_KEY, check_destination, export_release, sidecar
from pipeline.analyst.reader import AnalystError, NotReleased, PublicReader
from pipeline.analyst.text import format_answer
from pipeline.config import parse_config
from pipeline.queries import cumulative_counts, window_codes, window_histogram


@pytest.fixture(scope="module")
def released():
    dep = parse_config(analyst_config())
    poverty, occupation = panels()
    return dep, poverty, PublicReader(dep, released_store(dep, {"poverty": poverty, "occupation": occupation}))


def test_window_answer_is_debiased_labelled_and_its_interval_holds(released):
    """Debiased = synthetic pattern count − n_pad (public), shares of n (not m), ± λ at the release's β.
    λ (Bun et al., Thm 3.2) holds for every pattern at every step at once with probability ≥ 95%; with
    this seed it must hold — and the raw counts, off by n_pad = λ-sized padding, are not what is shown."""
    dep, poverty, reader = released
    panel = reader.store.panels["poverty-quarterly"]
    n_pad, lam = int(panel.parameters["n_pad"]), float(panel.parameters["accuracy_bound"])
    assert n_pad > 0 and lam > 0
    for t in range(3, T + 1):
        a = reader.answer("poverty-quarterly", t)
        raw = window_histogram(panel.as_array(), t, 3, 2)
        truth = window_histogram(poverty, t, 3, 2)
        est = np.array([r.estimate for r in a.rows])
        np.testing.assert_array_equal(est, raw - n_pad)
        assert np.all(np.abs(est - truth) <= lam)  # the theorem's bound, checked against the truth
        for r, c in zip(a.rows, truth):
            assert r.low <= c <= r.high and r.n == N
            assert r.low == max(0.0, r.estimate - lam) and r.high == min(float(N), r.estimate + lam)
            assert r.as_json()["share"] == r.estimate / N  # of n, never of the synthetic records m
    labels = [r.label for r in reader.answer("poverty-quarterly", T).rows]
    assert labels[7] == "poor in all 3 months (111)" and labels[0] == "poor in none of the 3 months (000)"
    assert labels[3] == "poor in months 2–3 of 3 only (011)" and labels[5] == "poor in months 1, 3 of 3 only (101)"
    raw_answer = reader.answer("poverty-quarterly", T, raw=True)
    assert [r.estimate for r in raw_answer.rows] == window_histogram(panel.as_array(), T, 3, 2).tolist()
    assert raw_answer.legacy["debiased"] is False and "padding" in raw_answer.notes[0]


def test_negative_debiased_counts_are_shown_with_their_interval_and_the_clipping_choice(released):
    dep, _, reader = released
    a = reader.answer("poverty-quarterly", T)
    row = a.rows[7]
    shown = type(row)(row.label, -3.0, 0.0, 14.0, N, key=7)
    a = type(a)(a.release, a.type, a.step, a.question, [shown], a.bound, a.notes)
    text = format_answer(a)
    assert "-3" in text and "[0, 14]" in text and "negative: noise" in text
    assert "only the interval is clipped to [0, n]" in text


def test_cumulative_answer_matches_the_records_and_the_bound(released):
    dep, poverty, reader = released
    panel = reader.store.panels["poverty-cumulative"]
    bound = reader.bounds["poverty-cumulative"].bounds["error"]
    for t in range(1, T + 1):
        a = reader.answer("poverty-cumulative", t)
        synth = cumulative_counts(panel.as_array()[:, :t])[t - 1]
        truth = cumulative_counts(poverty[:, :t])[t - 1]
        assert [r.key for r in a.rows] == list(range(1, t + 1))
        for r in a.rows:
            assert r.estimate == synth[r.key] and abs(r.estimate - truth[r.key]) <= bound
        assert a.rows[0].label == f"poor in at least 1 of the first {t} month{'s' if t > 1 else ''}"
    assert a.legacy["at_least"][0] == N and len(a.legacy["at_least"]) == T + 1


def test_questions_a_release_does_not_answer_are_refused_in_one_line(released):
    _, _, reader = released
    with pytest.raises(AnalystError, match="answers from step 3 on"):
        reader.answer("poverty-quarterly", 2)
    with pytest.raises(AnalystError, match="publishes alerts: `dpstream alerts` reads them"):
        reader.answer("occupation-heavy", 1)
    with pytest.raises(AnalystError, match="no such release 'nope'"):
        reader.answer("nope", 1)
    with pytest.raises(AnalystError, match=r"--step must be in 1..6"):
        reader.answer("poverty-cumulative", 9)


def test_unreleased_steps_are_not_released_errors():
    dep = parse_config(analyst_config())
    poverty, occupation = panels()
    reader = PublicReader(dep, released_store(dep, {"poverty": poverty, "occupation": occupation}, steps=[1, 2]))
    with pytest.raises(NotReleased, match="released through step 2"):
        reader.answer("poverty-cumulative", 3)
    with pytest.raises(NotReleased, match="nothing released"):
        reader.answer("poverty-quarterly", 3)


def test_alerts_say_what_was_flagged_and_when_flags_run_out(released):
    """"nurse" is held by half the users at every step: flagged at steps 1 and 2, then its users have
    spent their k = 2 flags and it silently drops out — the reader says so."""
    _, _, reader = released
    alerts = reader.alerts("occupation-heavy")
    assert [a["step"] for a in alerts] == list(range(1, T + 1))
    nurse = [a["step"] for a in alerts if 7 in a["flagged"]]
    assert nurse == [1, 2]
    assert "nurse" in alerts[0]["text"] and "flag 1 of k = 2" in alerts[0]["text"]
    assert "flags are now spent" in alerts[1]["text"]
    assert alerts[2]["text"] == "no value flagged"
    assert [a["step"] for a in reader.alerts(step=2)] == [2]
    kind_text = reader.explain(reader.deployment.release("occupation-heavy"))
    assert kind_text.startswith("with probability 95%, every value held by at least τ = ")


def test_export_carries_its_data_dictionary_and_flags_the_padding(released, tmp_path):
    dep, _, reader = released
    path, dictionary = export_release(reader, "poverty-quarterly", tmp_path / "q.parquet")
    table = pq.read_table(path)
    meta = json.loads(table.schema.metadata[METADATA_KEY])
    assert meta["deployment"] == "analyst-test" and meta["release"] == "poverty-quarterly" and meta["n"] == N
    assert meta["released_through"] == T and meta["n_pad_per_pattern"] == dictionary["n_pad_per_pattern"] > 0
    assert meta["patterns"]["7"] == "poor in all 3 months (111)" and meta["values"] == {"0": "not poor", "1": "poor"}
    assert meta["privacy"]["release_spent"] == {"rho": pytest.approx(0.25)}
    assert meta["error_bound"]["name"] == "lambda" and meta["error_bound"]["share_of_n"] == pytest.approx(
        meta["error_bound"]["value"] / N)
    assert "cumulative release answers those" in meta["does_not_answer"][0]
    # padding: per window, n_pad records per pattern of it; dropping them debiases that window exactly
    arr = np.column_stack([table[f"step_{t}"].to_numpy() for t in range(1, T + 1)])
    n_pad = meta["n_pad_per_pattern"]
    assert "padding" not in table.column_names  # one column cannot be every window's padding
    for t in range(3, T + 1):
        flags = table[f"padding_step_{t}"].to_numpy()
        raw = window_histogram(arr, t, 3, 2)
        assert flags.sum() == meta["padding_records"][f"padding_step_{t}"] == sum(min(n_pad, c) for c in raw)
        kept = window_histogram(arr[~flags], t, 3, 2)
        np.testing.assert_array_equal(kept, np.maximum(raw - n_pad, 0))
        assert np.all(np.bincount(window_codes(arr[flags], t, 3, 2), minlength=8) == np.minimum(raw, n_pad))

    csv_path, _ = export_release(reader, "poverty-cumulative", tmp_path / "c.csv")
    side = json.loads(sidecar(csv_path).read_text())
    assert side["release"] == "poverty-cumulative" and "padding" not in side["columns"]
    header = csv_path.read_text().splitlines()[0]
    assert header == "record," + ",".join(f"step_{t}" for t in range(1, T + 1))


def test_export_refuses_unknown_formats_and_unwritable_paths_in_one_line(tmp_path):
    with pytest.raises(AnalystError, match=r"unknown export format '.xlsx'; write .csv or .parquet"):
        check_destination(tmp_path / "q.xlsx")
    with pytest.raises(AnalystError, match="directory /nonexistent does not exist"):
        check_destination("/nonexistent/q.csv")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    import os

    if os.geteuid() != 0:  # root writes anywhere: the mode check cannot be seen as root
        with pytest.raises(AnalystError, match="not writable"):
            check_destination(locked / "q.csv")
    assert check_destination(tmp_path / "Q.PARQUET") == tmp_path / "Q.PARQUET"


def test_plan_gives_each_bound_as_a_share_of_n_in_words():
    from pipeline.plan_report import format_plan, plan_report

    dep = parse_config(analyst_config())
    report = plan_report(dep)
    text = format_plan(report)
    fw = report["releases"]["poverty-quarterly"]
    lam = fw["bounds"]["lambda"]
    assert fw["as_share_of_n"] == pytest.approx(lam / N)
    assert f"λ = {lam:,.2f} users ({lam / N:.2%} of n)" in text
    assert (f"in words: with probability 95%, every published window share is within ±{100 * lam / N:.2g} points "
            "of the truth") in text
    for name, r in report["releases"].items():
        assert r["in_words"].startswith("with probability") and r["bound_source"], name


def test_kinds_state_their_reading_side():
    """Every registered kind declares its output shape and answers, explains and labels through the kind
    (adding a kind touches its module and the registry only); the coordinator's metrics come from observe."""
    from pipeline.releases import ReleaseKind, kinds
    from pipeline.stream.process.metrics import METRICS

    for name, kind in kinds().items():
        assert kind.output in ("records", "histogram", "alerts"), name
        assert kind.bound_source, name
        assert type(kind).explain is not ReleaseKind.explain, name  # overridden
        if kind.output == "alerts":
            assert type(kind).alert_text is not ReleaseKind.alert_text, name
        else:
            assert type(kind).answer is not ReleaseKind.answer, name
    fw, hh = kinds()["fixed_window"], kinds()["heavy_hitters"]
    assert fw.observe({"clamped_bins": 2}, None) == {"padding_clamps": 2.0} and fw.observe({}, None) == {}
    assert hh.observe({}, {"flagged": [1, 5]}) == {"heavy_hitters": 2.0}
    for kind in kinds().values():
        for metric in kind.observe({"clamped_bins": 1}, {"flagged": [1]}):
            assert hasattr(METRICS, metric)


def test_relative_error_releases_answer_through_their_kind_and_the_page_says_what_it_cannot_draw(tmp_path):
    from pipeline.analyst.report import render_report
    from pipeline.releases.relative_error import group_interval

    cfg = {"name": "re-analyst", "roster": {"size": 400}, "horizon": 2,
           "attributes": {"occ": {"type": "categorical", "values": list("abcdefgh")}},
           "budget": {"epsilon": 4.0, "delta": 1e-6}, "random": {"kind": "seeded", "seed": 2},
           "releases": [{"name": "groups", "type": "relative_error", "attribute": "occ", "share": 0.5,
                         "queries": "groups", "groups": {"ab": ["a", "b"], "h": ["h"]}},
                        {"name": "ranges", "type": "relative_error", "attribute": "occ", "share": 0.5,
                         "queries": "dyadic"}]}
    dep = parse_config(cfg)
    occ = np.random.default_rng(4).integers(0, 8, size=(400, 2))
    reader = PublicReader(dep, released_store(dep, {"occ": occ}))
    a = reader.answer("groups", 2)
    hist = reader.store.panels["groups"].histograms[2]
    params = reader.store.panels["groups"].manifests[2]["parameters"]
    assert [r.label for r in a.rows] == ["ab", "h"] and a.rows[0].estimate == float(hist[[0, 1]].sum())
    assert (a.rows[0].low, a.rows[0].high) == group_interval(a.rows[0].estimate, params["zeta"], params["alpha"], 400)
    assert reader.answer("ranges", 1, group="0:4").rows[0].label == "0:4"
    with pytest.raises(AnalystError, match="name a code, value or range"):
        reader.answer("ranges", 1)
    page = render_report(reader)
    assert "No default series to draw" in page and "--group" in page and ">ab<" in page


def test_labels_are_outside_the_configuration_fingerprint():
    """A binary attribute's `label` and `steps.unit` only name things: changing them must not make a
    restarted deployment refuse its state as "another configuration"."""
    from pipeline.stream.state.fingerprint import privacy_config

    cfg = analyst_config()
    plain = json.loads(json.dumps(cfg))
    plain["attributes"]["poverty"].pop("label")
    plain.pop("steps")
    ids = [f"u{i}" for i in range(N)]
    assert privacy_config(parse_config(cfg), ids) == privacy_config(parse_config(plain), ids)


def test_band_alerts_in_words():
    from pipeline.config import parse_config as parse
    from pipeline.error_bounds import release_bounds
    from pipeline.releases import kind_of
    from pipeline.releases.reading import Context

    dep = parse({"name": "band", "roster": {"size": 5000}, "horizon": 4,
                 "attributes": {"job": {"type": "categorical", "values": ["nurse", "cook"]}},
                 "budget": {"epsilon": 1.0, "delta": 1e-6},
                 "releases": [{"name": "nurses", "type": "band_monitor", "attribute": "job", "value": "nurse",
                               "low": 1000, "high": 3000, "share": 1.0}]})
    rel = dep.releases[0]
    kind = kind_of(rel)
    bounds = release_bounds(dep, dep.budget_plan().allotments(), dep.n)["nurses"]
    ctx = Context(dep.attributes["job"], dep.n, bounds)
    alert = {"release": "nurses", "step": 2, "type": "band", "attribute": "job", "value": "nurse", "low": 1000,
             "high": 3000, "answer": "above"}
    assert kind.alert_text(rel, alert, ctx) == "users holding 'nurse': above the band [1000, 3000]"
    assert kind.alert_text(rel, dict(alert, answer="between"), ctx) == "users holding 'nurse': within the band [1000, 3000]"
    margin = bounds.bounds["margin"]
    assert kind.explain(bounds, dep.n).startswith(f"with probability 95%, an answer is wrong only when the true count is "
                                                  f"within {margin:,.0f} users")
    assert "leave the active set" in kind.flag_limit(rel) and kind.output == "alerts"
