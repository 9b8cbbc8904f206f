"""The calibration tables of docs/monitors.md, generated from the code so they cannot go stale.

``python -m jobs.eval.monitors_table`` prints every generated block; ``--write docs/monitors.md``
replaces the blocks between their markers (``<!-- generated:NAME -->`` …
``<!-- /generated:NAME -->``);
``--check docs/monitors.md`` exits 1 if a block differs from what the code computes (the test
``tests/test_docs_tables.py`` does the same).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from pipeline.monitors import calibration as cal
from pipeline.monitors.heavy_hitters import heavy_hitter_plan
from pipeline.privacy.pure_composition import advanced_epsilon, optimal_epsilon, zcdp_epsilon

EPSILON, DELTA, K, DOMAIN, HORIZON, BETA = 1.0, 1e-6, 3, 10**6, 10**4, 0.05


def _num(x: float) -> str:
    """Whole numbers with a thin space every three digits, as the docs write them."""
    return f"{int(x):,}".replace(",", " ")


def heavy_hitters_table() -> str:
    """§5: internal noise, threshold and τ of each method at the docs' example parameters."""
    rows = ["| method | internal noise | threshold t | τ (users) |", "|---|---|---|---|"]
    for method in ("tme", "tct", "svt_restart", "naive"):
        p = heavy_hitter_plan(method, DOMAIN, EPSILON, DELTA, K, HORIZON, BETA)
        if method == "tme":
            noise = (
                f"ε̃ = {p['epsilon_tilde']:.4f}, δ̃ = {p['delta_tilde']:.3g}; "
                f"w ~ DL({_num(p['scale_w'])}), v ~ DL({_num(p['scale_v'])}), "
                f"cap Δ = {_num(p['Delta'])}"
            )
        elif method == "tct":
            bound = cal.individual_charging_privacy(p["epsilon0"], K, DELTA)
            hits = cal.tct_hits_per_user(K, "replace")
            noise = (
                f"ε₀ = {p['epsilon0']:.5f} (DL scale {p['scale']:.1f}), {hits} hits, "
                f"cap m = {int(bound.r)} calls, {bound.form} composition"
            )
        elif method == "svt_restart":
            noise = f"ε₁ = {p['epsilon1']:.5f}, max_tops = {_num(p['max_tops'])}"
        else:
            noise = f"σ² = {_num(p['sigma2'])}"
        rows.append(f"| {method} | {noise} | {_num(p['threshold'])} | {_num(p['tau'])} |")
    return "\n".join(rows)


def target_charging_examples() -> str:
    """§2/§4: how the tct heavy-hitter monitor and the band monitor split δ at the example."""
    rows = [
        "| monitor | noise | hits | cap m | δ* = P[Bin(m, q) < hits] | δ to the m calls "
        "| ε by form: advanced / zCDP / optimal | used |",
        "|---|---|---|---|---|---|---|---|",
    ]
    eps0 = cal.calibrate_individual_charging(EPSILON, DELTA, K)
    a = cal.calibrate_outside_interval(EPSILON, DELTA)
    for name, e, hits in (
        ("tct (k = 3)", eps0, cal.tct_hits_per_user(K, "replace")),
        ("band", a, cal.outside_interval_hits_per_user("replace")),
    ):
        b = cal.TargetChargingAccountant(e, hits).best(DELTA)
        m, d_c = int(b.r), b.delta_composition
        theorems = (advanced_epsilon, zcdp_epsilon, optimal_epsilon)
        forms = " / ".join(f"{f(e, m, d_c):.3f}" for f in theorems)
        rows.append(
            f"| {name} | DL scale {1 / e:.2f} (ε₀ = {e:.5f}) | {hits} | {m} | "
            f"{b.delta_star:.2e} | {d_c:.2e} | {forms} | {b.form}, ε = {b.epsilon:.3f} |"
        )
    return "\n".join(rows)


BLOCKS = {
    "heavy-hitters-table": heavy_hitters_table,
    "target-charging-examples": target_charging_examples,
}


def _pattern(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- generated:{name} -->)\n?(.*?)\n?(<!-- /generated:{name} -->)", re.S)


def stale_blocks(text: str) -> list[str]:
    """Names of the generated blocks whose text differs from what the code computes (or that are
    missing)."""
    stale = []
    for name, render in BLOCKS.items():
        found = _pattern(name).search(text)
        if found is None or found.group(2) != render():
            stale.append(name)
    return stale


def regenerate(text: str) -> str:
    for name, render in BLOCKS.items():
        body = render()
        text, count = _pattern(name).subn(lambda mt: f"{mt.group(1)}\n{body}\n{mt.group(3)}", text)
        if count != 1:
            raise SystemExit(
                f"docs: the markers of block {name!r} appear {count} times (need exactly 1)"
            )
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--write", type=Path, help="replace the generated blocks in this file")
    group.add_argument(
        "--check", type=Path, help="exit 1 if a generated block in this file is stale"
    )
    args = ap.parse_args(argv)
    if args.write:
        args.write.write_text(regenerate(args.write.read_text()))
        return 0
    if args.check:
        stale = stale_blocks(args.check.read_text())
        if stale:
            print(
                f"{args.check}: stale generated blocks: {', '.join(stale)} "
                f"(python -m jobs.eval.monitors_table --write {args.check})",
                file=sys.stderr,
            )
            return 1
        return 0
    for name, render in BLOCKS.items():
        print(f"<!-- generated:{name} -->\n{render()}\n<!-- /generated:{name} -->\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
