"""``dpstream plan --sweep`` / ``--target`` (pipeline.plan_sweep): argument checks and output."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

import yaml

from pipeline.cli.common import EXIT_CONFIG, EXIT_OK, _fail
from pipeline.plan_sweep import find_target, format_sweep, format_target, parse_sweep, sweep
from pipeline.releases import kind_of

if TYPE_CHECKING:
    from pipeline.config import Deployment


def _default_key(deployment: Deployment, release: str) -> str:
    rel = next((r for r in deployment.releases if r.name == release), None)
    if rel is None:
        raise ValueError(
            f"--target: no release named {release!r} "
            f"(releases: {', '.join(r.name for r in deployment.releases)})"
        )
    return "budget.rho" if kind_of(rel).budget == "zcdp" else "budget.epsilon"


def _current(data: dict, key: str) -> float:
    node: Any = data
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, (int, float)) or isinstance(node, bool) or node <= 0:
        raise ValueError(
            f"--vary {key!r} is not a positive number in the configuration; give --within LOW,HIGH"
        )
    return float(node)


def cmd_plan_search(args, deployment: Deployment) -> int:
    """``deployment`` is the configuration as loaded (and validated) by ``dpstream plan``."""
    if args.sweep and args.target:
        return _fail(EXIT_CONFIG, "give --sweep or --target, not both")
    with open(args.config) as f:
        data = yaml.safe_load(f)
    try:
        if args.sweep:
            key, values = parse_sweep(args.sweep)
            points = sweep(data, key, values, source=args.config)
            if args.json:
                rows = [dataclasses.asdict(p) for p in points]
                print(json.dumps({"key": key, "n": deployment.n, "points": rows}))
            else:
                print(format_sweep(key, points, deployment.n))
            return EXIT_OK
        release, sep, share_text = args.target.partition("=")
        if not sep:
            raise ValueError(
                "--target must look like RELEASE=SHARE (e.g. poverty-quarterly=0.02), "
                f"got {args.target!r}"
            )
        try:
            share = float(share_text)
        except ValueError:
            raise ValueError(f"--target share must be a number, got {share_text!r}") from None
        key = args.vary or _default_key(deployment, release)
        if args.within:
            try:
                low, high = (float(x) for x in args.within.split(","))
            except ValueError:
                raise ValueError(f"--within must be LOW,HIGH, got {args.within!r}") from None
        else:
            now = _current(data, key)
            low, high = now / 1000.0, now * 1000.0
        result = find_target(data, key, release, share, low, high, source=args.config)
    except ValueError as err:
        return _fail(EXIT_CONFIG, str(err))
    if args.json:
        print(json.dumps(dataclasses.asdict(result)))
    else:
        print(format_target(result, deployment.n))
    return EXIT_OK
