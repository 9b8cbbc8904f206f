"""The analysts' commands (``query``, ``export``, ``alerts``, ``report``, ``hash``): public topics
only.

Each takes the :class:`~pipeline.analyst.source.PublicSource` (broker, topic names, an optional
configuration checked against the published descriptor) and the parsed arguments, prints its output
and returns the exit code; :class:`~pipeline.analyst.reader.AnalystError` (exit 2) and
:class:`~pipeline.analyst.reader.NotReleased` (exit 1) are turned into one line by ``pipeline.cli``.
None of them connects to Redis (the curator's state, which holds the drawn noise).
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.releases import kind_of

from .reader import AnalystError

__all__ = ["query", "export", "alerts", "hash_values", "report"]


def query(source, args) -> int:
    from .text import format_answer

    reader = source.read()
    answer = reader.answer(args.release, args.step, raw=args.raw, group=args.group)
    print(json.dumps(answer.as_json()) if args.json else format_answer(answer))
    return 0


def export(source, args) -> int:
    from .export import check_destination, export_release, sidecar

    check_destination(args.out)  # before reading the topics
    reader = source.read()
    path, dictionary = export_release(reader, args.release, args.out)
    where = (
        "in the Parquet schema metadata (key 'dpstream')"
        if path.suffix.lower() == ".parquet"
        else f"in {sidecar(path)}"
    )
    print(
        f"wrote {dictionary['records']} records x {dictionary['released_through']} steps to {path}; "
        f"data dictionary {where}"
    )
    return 0


def alerts(source, args) -> int:
    from .text import alert_line, format_alerts

    reader = source.read()
    if args.names:
        from .names import read_names, with_names

        reader.deployment = with_names(reader.deployment, read_names(args.names))
    found = reader.alerts(args.release, args.step)
    rels = (
        [reader.release(args.release, "alerts")]
        if args.release
        else [r for r in reader.deployment.releases if kind_of(r).output == "alerts"]
    )
    explain = {r.name: [reader.explain(r), kind_of(r).flag_limit(r)] for r in rels}
    if args.json:
        print(json.dumps({"alerts": found, "explain": explain}), flush=True)
    else:
        print(format_alerts(found, explain), flush=True)
    if args.follow:
        from .follow import follow_alerts

        show = (
            (lambda a: print(json.dumps(a), flush=True))
            if args.json
            else (lambda a: print(alert_line(a), flush=True))
        )
        if not args.json:
            print("following: new alerts below as they are published (Ctrl-C stops)", flush=True)
        shown = {(r, s) for (r, s) in reader.store.alerts}
        follow_alerts(reader, source.broker, source.names["alerts"], shown, show, args.release)
    return 0


def hash_values(source, args) -> int:
    """The codes of the given names under the deployment's public hash (``dpstream hash``)."""
    from .names import codes_of, hashed_attribute, read_names

    reader = source.read()
    name, attribute = hashed_attribute(reader.deployment, args.attribute)
    values = list(args.values) + (read_names(args.names) if args.names else [])
    if not values:
        raise AnalystError("give values to hash, or --names FILE")
    codes = codes_of(values, int(attribute.size))
    if args.json:
        print(json.dumps({"attribute": name, "size": int(attribute.size), "codes": codes}))
    else:
        for value, code in codes.items():
            print(f"{code}\t{value}")
    return 0


def report(source, args) -> int:
    from .report import write_report

    reader = source.read()
    path = write_report(reader, Path(args.out))
    print(f"wrote {path} (self-contained: open it in a browser, no network needed)")
    return 0
