"""The analysts' commands: `query`, `export`, `alerts`, `report`, `hash` (pipeline.analyst), from
the public topics only, never Redis. They need the broker and the deployment's name (``--broker``,
``--deployment``) or a configuration; n, labels and parameters come from the published descriptor
(pipeline.descriptor)."""

from __future__ import annotations

import os
import sys

from pipeline.cli.common import (
    EXIT_CONFIG,
    EXIT_OK,
    EXIT_RUNTIME,
    _check_reachable,
    _endpoints,
    _fail,
    _load,
)
from pipeline.extras import missing_extra


def add_source_args(sp):
    """Where an analyst's command reads: a configuration, or the broker and deployment name."""
    sp.add_argument(
        "--config",
        help="deployment YAML (optional: checked against the published "
        "descriptor; its roster file is not needed)",
    )
    sp.add_argument(
        "--broker", help="bootstrap servers (default: the configuration's, or its `dpstream up`)"
    )
    sp.add_argument("--deployment", help="the deployment's name (default: the configuration's)")
    sp.add_argument(
        "--topic-prefix",
        default=None,
        help="the deployment's topics.prefix (default: the configuration's, else dpstream)",
    )
    return sp


def add_alerts_args(sp):
    sp.add_argument(
        "--names",
        help="a file of candidate names, one a line: hashed codes are shown "
        "by the names that hash to them (the deployment's public hash; names from the "
        "file, never the reports)",
    )
    sp.add_argument(
        "--follow",
        action="store_true",
        help="keep running and print each new alert as it is published (Ctrl-C stops)",
    )
    return sp


def add_hash_parser(sub):
    h = add_source_args(
        sub.add_parser(
            "hash",
            help="the code of each value of a hashed attribute "
            "under the deployment's public hash (public topics only)",
        )
    )
    h.add_argument("values", nargs="*", help="values to hash")
    h.add_argument("--names", help="a file of values, one a line")
    h.add_argument("--attribute", help="the hashed attribute (default: the only one)")
    h.add_argument("--json", action="store_true", help="machine-readable output")
    h.set_defaults(func=cmd_hash)
    return h


def _source(args):
    """The PublicSource the arguments name, or SystemExit(2) with what is missing."""
    from pipeline.analyst.source import PublicSource, public_names
    from pipeline.stream.kafka.topics import topic_names

    if args.config:
        deployment = _load(args.config)
        if args.deployment and args.deployment != deployment.name:
            raise SystemExit(
                _fail(
                    EXIT_CONFIG,
                    f"--deployment {args.deployment} names another "
                    f"deployment than --config {args.config} "
                    f"({deployment.name})",
                )
            )
        broker = args.broker or _endpoints(deployment, redis=False)[0]
        prefix = args.topic_prefix
        names = topic_names(deployment) if prefix is None else public_names(prefix, deployment.name)
        source = PublicSource(broker, names, deployment.name, deployment)
    elif args.broker and args.deployment:
        names = public_names(args.topic_prefix or "dpstream", args.deployment)
        source = PublicSource(args.broker, names, args.deployment)
    else:
        raise SystemExit(
            _fail(EXIT_CONFIG, "say where to read: --broker and --deployment, or --config")
        )
    _check_reachable(source.broker, None)
    return source


# -- consuming: the analysts' commands (pipeline.analyst), public topics only, never Redis ---------
def _analyst(command: str, args) -> int:
    from pipeline.analyst import commands
    from pipeline.analyst.reader import AnalystError, NotReleased

    try:
        code = getattr(commands, command)(_source(args), args)
        sys.stdout.flush()  # here, not at exit: a closed pipe is then one of the cases below
        return code
    except AnalystError as err:
        return _fail(EXIT_CONFIG, str(err))
    except NotReleased as err:
        return _fail(EXIT_RUNTIME, str(err))
    except KeyboardInterrupt:  # --follow stopped by Ctrl-C: what was shown is the output
        return EXIT_OK
    except BrokenPipeError:  # `dpstream alerts | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the exit's flush: nowhere
        return EXIT_OK


def cmd_export(args) -> int:
    missing = (
        missing_extra("dpstream export to Parquet", "pyarrow")
        if args.out.endswith(".parquet")
        else None
    )
    return _fail(EXIT_CONFIG, missing) if missing else _analyst("export", args)


def cmd_query(args) -> int:
    return _analyst("query", args)


def cmd_alerts(args) -> int:
    return _analyst("alerts", args)


def cmd_report(args) -> int:
    missing = missing_extra("dpstream report", "plotly")
    return _fail(EXIT_CONFIG, missing) if missing else _analyst("report", args)


def cmd_hash(args) -> int:
    return _analyst("hash_values", args)
