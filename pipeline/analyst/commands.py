"""The analysts' commands (``query``, ``export``, ``alerts``, ``report``): public topics only.

Each takes the loaded deployment, the broker address and the parsed arguments, prints its output
and returns the exit code; :class:`~pipeline.analyst.reader.AnalystError` (exit 2) and
:class:`~pipeline.analyst.reader.NotReleased` (exit 1) are turned into one line by ``pipeline.cli``.
None of them connects to Redis (the curator's state, which holds the drawn noise).
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.releases import kind_of

from .reader import PublicReader

__all__ = ["query", "export", "alerts", "report"]


def query(dep, broker: str, args) -> int:
    from .text import format_answer

    reader = PublicReader.from_broker(dep, broker)
    answer = reader.answer(args.release, args.step, raw=args.raw, group=args.group)
    print(json.dumps(answer.as_json()) if args.json else format_answer(answer))
    return 0


def export(dep, broker: str, args) -> int:
    from .export import check_destination, export_release, sidecar

    check_destination(args.out)  # before reading the topics
    reader = PublicReader.from_broker(dep, broker)
    path, dictionary = export_release(reader, args.release, args.out)
    where = "in the Parquet schema metadata (key 'dpstream')" if path.suffix.lower() == ".parquet" else \
        f"in {sidecar(path)}"
    print(f"wrote {dictionary['records']} records x {dictionary['released_through']} steps to {path}; "
          f"data dictionary {where}")
    return 0


def alerts(dep, broker: str, args) -> int:
    from .text import format_alerts

    reader = PublicReader.from_broker(dep, broker)
    found = reader.alerts(args.release, args.step)
    rels = [reader.release(args.release, "alerts")] if args.release else \
        [r for r in dep.releases if kind_of(r).output == "alerts"]
    explain = {r.name: [reader.explain(r), kind_of(r).flag_limit(r)] for r in rels}
    if args.json:
        print(json.dumps({"alerts": found, "explain": explain}))
    else:
        print(format_alerts(found, explain))
    return 0


def report(dep, broker: str, args) -> int:
    from .report import write_report

    reader = PublicReader.from_broker(dep, broker)
    path = write_report(reader, Path(args.out))
    print(f"wrote {path} (self-contained: open it in a browser, no network needed)")
    return 0
