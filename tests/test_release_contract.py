"""The release-kind contract is code: a kind missing a member of ReleaseWriter / ReleaseReader (or
of CountsKind / AlertsKind) fails when its module is imported, naming what it lacks."""

from __future__ import annotations

import importlib
import sys
import textwrap

import pytest

from pipeline.releases import AlertsKind, CountsKind, ReleaseReader, ReleaseWriter, kinds, register
from pipeline.releases.band_monitor import BandMonitorKind
from pipeline.releases.fixed_window import FixedWindowKind


def _members(kind: type) -> dict[str, object]:
    """A registered kind's own members, under a fresh name (the registry takes each name once)."""
    members = {k: v for k, v in vars(kind).items() if not k.startswith("__")}
    members["name"] = f"copy_of_{kind.name}"
    return members


def _without(kind: type, base: type, member: str) -> type:
    members = _members(kind)
    members.pop(member, None)
    return type(f"Broken{kind.__name__}", (base,), members)


def test_both_sides_declare_their_members_abstract():
    writer = ReleaseWriter.__abstractmethods__
    assert {"aggregator", "build", "events", "bounds", "release_step"} <= writer
    assert {"questions", "explain"} <= ReleaseReader.__abstractmethods__
    assert "answer" in CountsKind.__abstractmethods__
    assert {"alert_text", "flag_limit"} <= AlertsKind.__abstractmethods__


def test_every_registered_kind_is_a_counts_or_alerts_kind():
    for name, kind in kinds().items():
        assert isinstance(kind, AlertsKind if kind.output == "alerts" else CountsKind), name


@pytest.mark.parametrize("kind, base, member",
                         [(FixedWindowKind, CountsKind, m) for m in sorted(CountsKind.__abstractmethods__)]
                         + [(BandMonitorKind, AlertsKind, m) for m in sorted(AlertsKind.__abstractmethods__)])
def test_a_kind_missing_a_member_is_refused_at_registration(kind, base, member):
    broken = _without(kind, base, member)
    with pytest.raises(TypeError, match=f"lacks .*{member}"):
        register(broken)
    assert broken.name not in kinds()


@pytest.mark.parametrize("attribute", ["name", "config", "budget", "bound_source"])
def test_a_kind_missing_a_class_attribute_is_refused(attribute):
    members = _members(FixedWindowKind)
    members.pop(attribute, None)
    broken = type("NoAttribute", (CountsKind,), members)
    with pytest.raises(TypeError, match=f"lacks {attribute}"):
        register(broken)


def test_a_complete_copy_registers():
    """The tests above fail for the missing member only: the same members, all of them, register."""
    complete = type("Complete", (CountsKind,), _members(FixedWindowKind))
    try:
        assert register(complete) is complete and "copy_of_fixed_window" in kinds()
    finally:
        from pipeline.releases import base

        base._REGISTRY.pop("copy_of_fixed_window", None)


def test_a_module_with_an_incomplete_kind_fails_at_import(tmp_path, monkeypatch):
    (tmp_path / "incomplete_kind.py").write_text(textwrap.dedent('''
        from typing import Literal

        from pipeline.releases import CountsKind, ReleaseConfig, register


        class IncompleteRelease(ReleaseConfig):
            type: Literal["incomplete"]


        @register
        class IncompleteKind(CountsKind[IncompleteRelease]):
            name = "incomplete"
            config = IncompleteRelease
            budget = "zcdp"
            bound_source = "none"

            def questions(self, release, unit="step"):
                return [], []
    '''))
    monkeypatch.syspath_prepend(str(tmp_path))
    lacks = "IncompleteKind lacks aggregator, answer, bounds, build, events, explain, release_step"
    with pytest.raises(TypeError, match=lacks):
        importlib.import_module("incomplete_kind")
    sys.modules.pop("incomplete_kind", None)
    assert "incomplete" not in kinds()
