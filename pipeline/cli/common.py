"""What every ``dpstream`` command shares: exit codes, loading the configuration, one-line failures, the
deployment's endpoints (configured, or those of a running `dpstream up`) and the check that they answer.

(The exit codes are documented in :mod:`pipeline.cli`.)

The audience modules (lifecycle, operator, analyst) import this one; it imports none of them.
Nothing heavy is imported at module level (the connections and their pydantic models are imported
by the functions that use them): ``pipeline.cli`` imports this module to build its parser, and
``dpstream --help`` needs none of them (tests/test_cli_imports.py).
"""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING, Literal, overload

if TYPE_CHECKING:
    from pipeline.config import Deployment

EXIT_OK, EXIT_RUNTIME, EXIT_CONFIG = 0, 1, 2
EXIT_REFUSED = 3  # refused by the deployment's state now, nothing done (pipeline.cli: exit codes)
EXIT_STATE_LOST = 4
EXIT_REJECTED = (
    5  # produce: the workers dead-lettered some of the reports it sent (or a dry run: would)
)
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), the shells' convention
_CONFIG_ARG: list[str] = []  # the --config as typed, for the hints in messages


def _load(path: str):
    from pipeline.config import ConfigError, load_config
    from pipeline.connections import use_security
    from pipeline.privacy.errors import PrivacyBudgetError

    try:
        deployment = load_config(path)  # includes the budget plan: refused before anything starts
    except FileNotFoundError:
        raise SystemExit(_fail(EXIT_CONFIG, f"no such configuration file: {path}")) from None
    except (ConfigError, PrivacyBudgetError) as err:
        raise SystemExit(_fail(EXIT_CONFIG, f"configuration refused: {err}")) from None
    use_security(
        deployment.security
    )  # every client this command builds connects as configured (pipeline.connections)
    return deployment


def _fail(code: int, message: str) -> int:
    print(f"dpstream: {message}", file=sys.stderr)
    return code


def _up_record(name: str) -> dict | None:
    """What `dpstream up` of deployment ``name`` recorded in its endpoints file, with ``alive``: whether that
    `up` still runs (False: a stale file left by a killed `up`). None when there is no file."""
    from pipeline.stream.local.cluster import endpoints_file
    from pipeline.stream.local.embedded import pid_alive

    path = endpoints_file(name)
    try:
        data = json.loads(path.read_text())
        pid = int(data["pid"])
    except FileNotFoundError:
        return None
    except (KeyError, ValueError, TypeError):
        return {"pid": None, "alive": False, "path": path}
    return dict(data, pid=pid, alive=pid_alive(pid), path=path)


def _stale(rec: dict) -> str:
    config = _CONFIG_ARG[0] if _CONFIG_ARG else "<config>"
    return (
        f"stale endpoints file {rec['path']}: the `dpstream up` that wrote it (pid {rec['pid']}) is no longer "
        f"running; `dpstream down --config {config}` removes it and stops anything it left behind"
    )


_REACH_TIMEOUT = (
    5.0  # seconds per service: a command against a dead broker or Redis fails in well under 15 s
)
_reached: set[str] = set()


def _check_reachable(broker: str, redis_url: str | None) -> None:
    """One line and exit 1 if the broker or Redis (unless None) does not answer (instead of a client's retry loop)."""
    import socket

    import redis

    from pipeline.connections import connection_failure, redis_client
    from pipeline.security import redact_url

    if broker not in _reached:
        errors = []
        for address in broker.split(","):
            host, _, port = address.strip().rpartition(":")
            try:
                socket.create_connection(
                    (host.strip("[]") or "127.0.0.1", int(port)), timeout=_REACH_TIMEOUT
                ).close()
                break
            except (OSError, ValueError) as err:
                errors.append(f"{address}: {err}")
        else:
            raise SystemExit(_fail(EXIT_RUNTIME, f"broker unreachable ({'; '.join(errors)})"))
        _check_broker_protocol(broker)
        _reached.add(broker)
    if redis_url is not None and redis_url not in _reached:
        try:
            redis_client(
                redis_url, socket_connect_timeout=_REACH_TIMEOUT, socket_timeout=_REACH_TIMEOUT
            ).ping()
        except redis.RedisError as err:
            raise SystemExit(
                _fail(
                    EXIT_RUNTIME,
                    connection_failure(err)
                    or f"Redis unreachable at {redact_url(redis_url)} ({_redacted(err, redis_url)})",
                )
            ) from None
        _reached.add(redis_url)


def _redacted(err: BaseException, url: str) -> str:
    """An error's text without the URL's password, should the client have quoted it."""
    from urllib.parse import urlsplit

    text = str(err)
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    return text.replace(password, "***") if password else text


@overload
def _endpoints(
    deployment: Deployment, check: bool = ..., redis: Literal[True] = ...
) -> tuple[str, str]: ...


@overload
def _endpoints(
    deployment: Deployment, check: bool = ..., *, redis: Literal[False]
) -> tuple[str, None]: ...


def _endpoints(
    deployment: Deployment, check: bool = True, redis: bool = True
) -> tuple[str, str | None]:
    """Broker and Redis of a deployment: configured, or those of a running `dpstream up`; checked to answer.
    ``redis=False`` (the analysts' commands: public topics only) neither needs nor touches Redis."""
    from pipeline.connections import check_secrets, kafka_security
    from pipeline.security import check_no_password_in_url
    from pipeline.stream.local.cluster import endpoints_file

    # an unset variable or unreadable file is one line now, not a client's retry loop; an analyst has no
    # Redis secret to read
    check_secrets() if redis else kafka_security()
    broker = os.environ.get("DPSTREAM_BROKER") or deployment.broker
    redis_url = (os.environ.get("DPSTREAM_REDIS") or deployment.redis) if redis else None
    redis_url_given = bool(redis_url)
    if redis and os.environ.get("DPSTREAM_REDIS"):
        try:
            check_no_password_in_url(os.environ["DPSTREAM_REDIS"], "DPSTREAM_REDIS")
        except ValueError as err:
            raise SystemExit(_fail(EXIT_CONFIG, str(err))) from None
    if not (broker and (redis_url or not redis)):
        rec = _up_record(deployment.name)
        if rec is None:
            raise SystemExit(
                _fail(
                    EXIT_CONFIG,
                    f"deployment {deployment.name!r} names no broker/Redis and no `dpstream up` "
                    f"is running for it (no {endpoints_file(deployment.name)})",
                )
            )
        if not rec["alive"]:
            raise SystemExit(_fail(EXIT_CONFIG, _stale(rec)))
        if "broker" not in rec:
            raise SystemExit(
                _fail(
                    EXIT_RUNTIME,
                    f"`dpstream up` of deployment {deployment.name!r} (pid {rec['pid']}) is "
                    "still starting; try again in a moment",
                )
            )
        if not broker and rec.get(
            "broker_tls"
        ):  # the embedded broker's gate: its client certificate
            from pipeline.stream.local.broker_tls import BROKER_TLS_ENV

            os.environ.setdefault(BROKER_TLS_ENV, rec["broker_tls"])
        broker, redis_url = broker or rec["broker"], (redis_url or rec["redis"]) if redis else None
        if redis and rec.get("local_secrets") and not redis_url_given:
            from pipeline.stream.local.embedded import LOCAL_SECRETS_ENV

            os.environ.setdefault(
                LOCAL_SECRETS_ENV, rec["local_secrets"]
            )  # the embedded Redis's password file
    if check:
        _check_reachable(broker, redis_url)
    return broker, redis_url


def _check_broker_protocol(broker: str) -> None:
    """One line and exit 1 when the broker speaks TLS to a plain client or plain Kafka to a TLS one
    (a client would otherwise time out saying only that it could not bootstrap)."""
    from pipeline.connections import SecretUnavailable, check_broker_listener
    from pipeline.stream.kafka.listener_check import ListenerMismatch

    try:
        check_broker_listener(broker)
    except SecretUnavailable:
        return  # said by the client's own failure, naming the key
    except ListenerMismatch as err:
        raise SystemExit(_fail(EXIT_RUNTIME, str(err))) from None


def _unreachable(err: BaseException) -> str | None:
    """What a broker/Redis connection failure in the middle of a command was, or None (not one)."""
    import redis
    from kafka import errors as kafka_errors
    from kafka.errors import KafkaConnectionError, KafkaTimeoutError

    from pipeline.connections import connection_failure

    NoBrokersAvailable = getattr(
        kafka_errors, "NoBrokersAvailable", KafkaConnectionError
    )  # gone in kafka-python 3

    try:
        from aiokafka.errors import KafkaConnectionError as AioConnectionError
    except ImportError:  # pragma: no cover
        AioConnectionError = KafkaConnectionError
    refused = connection_failure(err)  # a refused login, a TLS failure: says which key to check
    if refused:
        return refused
    if isinstance(err, (redis.ConnectionError, redis.TimeoutError)):
        return f"Redis unreachable ({err})"
    if isinstance(
        err, (NoBrokersAvailable, KafkaConnectionError, KafkaTimeoutError, AioConnectionError)
    ):
        return f"broker unreachable ({type(err).__name__}: {err})"
    return None
