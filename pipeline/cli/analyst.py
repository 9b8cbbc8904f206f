"""The analysts' commands: `query`, `export`, `alerts`, `report` (pipeline.analyst), from the public topics
only, never Redis."""

from __future__ import annotations

from pipeline.cli.common import EXIT_CONFIG, EXIT_RUNTIME, _endpoints, _fail, _load


# -- consuming: the analysts' commands (pipeline.analyst), public topics only, never Redis ------------------
def _analyst(command: str, args) -> int:
    from pipeline.analyst import commands
    from pipeline.analyst.reader import AnalystError, NotReleased

    dep = _load(args.config)
    broker, _ = _endpoints(dep, redis=False)
    try:
        return getattr(commands, command)(dep, broker, args)
    except AnalystError as err:
        return _fail(EXIT_CONFIG, str(err))
    except NotReleased as err:
        return _fail(EXIT_RUNTIME, str(err))


def cmd_export(args) -> int:
    return _analyst("export", args)


def cmd_query(args) -> int:
    return _analyst("query", args)


def cmd_alerts(args) -> int:
    return _analyst("alerts", args)


def cmd_report(args) -> int:
    return _analyst("report", args)
