"""The control plane belongs to the curator: a close marker or a close command counts only with a
signature no producer, worker or other client can make (pipeline.stream.control). Probed on real
processes: the embedded broker and Redis, the worker and releaser jobs, the clients an adversary
with the producer role's access would use (the project's report producer, a plain kafka-python
client)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from jobs.eval.testbed import binary_panel, write_panel_deployment
from pipeline.config import load_config
from pipeline.stream.control.signatures import (
    CloseCommand,
    CloseSigner,
    CloseVerifier,
    SignedClose,
    Unverified,
    deployment_fingerprint,
)
from pipeline.stream.control.signing_keys import (
    CONTROL_KEY_ENV,
    CONTROL_PUBLIC_KEY_ENV,
    DEADLINE_KEY_ENV,
    DEADLINE_PUBLIC_KEY_ENV,
    ensure_keys,
    load_private,
)
from pipeline.stream.ingest.roster import Roster
from pipeline.stream.kafka.messages import CONTROL_HEADER
from pipeline.stream.local.cluster import LocalCluster
from pipeline.stream.local.driver import StepDriver
from pipeline.stream.local.embedded import EmbeddedServices
from pipeline.stream.local.leftovers import process_environ
from pipeline.stream.state.store import StateStore

N, T, PARTITIONS = 400, 3, 2


@pytest.fixture(scope="module")
def services():
    with EmbeddedServices() as svc:
        yield svc


def dead_letters(
    bootstrap: str, topic: str, expect: int, timeout: float = 60.0
) -> list[tuple[dict, bytes]]:
    """The dead-letter topic's records, one per source position, once it holds ``expect`` of them
    (or the timeout passed). Workers read at least once: a record read again after the group
    rebalances (the second worker joining) is dead-lettered again under the same source."""
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    out: dict[bytes, tuple[dict, bytes]] = {}
    deadline = time.monotonic() + timeout
    while len(out) < expect and time.monotonic() < deadline:
        for msgs in consumer.poll(timeout_ms=200).values():
            for m in msgs:
                headers = dict(m.headers)
                out.setdefault(headers.get("dpstream-source", b""), (headers, m.value))
    consumer.close()
    return list(out.values())


def test_forged_markers_and_commands_are_dead_lettered_and_close_nothing(services, tmp_path):
    """Before: a producer wrote ``{"step": 1}`` with header ``dpstream-control: close`` to every
    reports
    partition; the workers closed step 1, the releaser released it and charged the budget, with no
    close
    command. Now every forged marker and command is dead-lettered as ``unauthenticated``: nothing
    closes,
    nothing is released or charged, and the curator's own close still works afterwards."""
    path = write_panel_deployment(
        tmp_path, services, "ctl-forged", n=N, horizon=T, partitions=PARTITIONS
    )
    dep = load_config(path)
    roster = Roster.from_config(dep.roster)
    store = StateStore.from_url(services.redis.url, dep.name)
    with LocalCluster(path, dep, workers=1, log_dir=tmp_path / "logs") as cluster:
        names = cluster.names
        drv = StepDriver(cluster.broker, dep, roster, names, cluster=cluster)
        drv.producer.send_step(1, {"pov": binary_panel(3, N, T)[:, 0]})
        fingerprint = deployment_fingerprint(dep, roster.ids)
        attacker = CloseSigner(Ed25519PrivateKey.generate(), dep.name, fingerprint, "close")
        curator = load_private(cluster.control_keys().curator.private)
        elsewhere = CloseSigner(
            curator, "another-deployment", fingerprint, "close"
        )  # a genuine signature...
        now = int(time.time() * 1000)
        markers = [
            orjson.dumps({"step": 1, "closed_at": now}),  # what closed steps before
            attacker.sign(1, now).marker(),  # a signature under a key that is not the curator's
            elsewhere.sign(1, now).marker(),  # ... replayed from another deployment
            SignedClose(
                1, now + 1, "close", elsewhere.sign(1, now).signature
            ).marker(),  # another close time
            SignedClose(
                1, now, "deadline", attacker.sign(1, now).signature
            ).marker(),  # an action not accepted
        ]
        commands = [
            orjson.dumps({"command": "close", "step": 1}),
            CloseCommand.signed(attacker, range(1, 2), now).value(),
        ]
        # the producer role's client (the project's report producer, its configured security) ...
        for p in range(PARTITIONS):
            for value in markers[:3]:
                drv.producer._producer.send(
                    names["reports"], value=value, partition=p, headers=[(CONTROL_HEADER, b"close")]
                )
        drv.producer._producer.send(names["control"], value=commands[0])
        drv.producer._producer.flush()
        # ... and a plain kafka-python client with no credentials at all
        plain = KafkaProducer(bootstrap_servers=cluster.broker)
        for p in range(PARTITIONS):
            for value in markers[3:]:
                plain.send(
                    names["reports"], value=value, partition=p, headers=[(CONTROL_HEADER, b"close")]
                )
        plain.send(names["control"], value=commands[1])
        plain.flush()
        plain.close()

        expected = len(markers) * PARTITIONS + len(commands)
        letters = dead_letters(cluster.broker, names["dead-letter"], expected)
        reasons = [h.get("dpstream-reason") for h, _ in letters]
        assert reasons == [b"unauthenticated"] * expected, [(h, v[:80]) for h, v in letters]
        assert sorted(v for _, v in letters) == sorted(
            markers * PARTITIONS + commands
        )  # the original bytes
        assert {h["dpstream-source"].split(b"/")[0] for h, _ in letters} == {
            names["reports"].encode(),
            names["control"].encode(),
        }
        time.sleep(
            2
        )  # a release, had anything closed, would have followed the partials within this
        assert (store.last_closing(), store.last_released(), store.ledger()) == (0, 0, {})
        assert not drv.step_complete(1)

        drv.close(1, timeout=120)  # the curator's close: signed with the key `up` generated
        assert (store.last_closing(), store.last_released()) == (1, 1)
        assert sorted(store.ledger()) == ["cu:1"]  # the window release spends from step 3 on
        # the step's users are those of the reports sent, none imputed by a forged early close
        intake = store.intake()
        assert sum(int(s["history"]["1"]["reported"]) for s in intake.values()) == N
        drv.shutdown()


def test_stream_processes_get_public_keys_only(services, tmp_path):
    """The curator's private key never reaches a worker or the releaser; the deadline key only the
    releaser
    of a deployment that closes on a deadline. Key files are owner-only. A job without the public
    key
    refuses to start (exit code 2), naming the variable."""
    path = write_panel_deployment(
        tmp_path,
        services,
        "ctl-env",
        n=N,
        horizon=T,
        partitions=PARTITIONS,
        steps={"close": "deadline", "deadline_seconds": 3600},
    )
    dep = load_config(path)
    with LocalCluster(
        path, dep, workers=1, data_dir=tmp_path / "state", log_dir=tmp_path / "logs"
    ) as cluster:
        keys = cluster.control_keys()
        assert keys.directory == tmp_path / "state" / "control"
        for f in (keys.curator.private, keys.deadline.private):
            assert f.stat().st_mode & 0o777 == 0o600, f
        assert keys.directory.stat().st_mode & 0o777 == 0o700
        environ = {  # reread while a just-spawned process is mid-exec (its environment reads empty)
            name: dict(kv.decode().split("=", 1) for kv in process_environ(proc.pid))
            for name, proc in cluster.procs.items()
        }
        for name, env in environ.items():
            assert CONTROL_KEY_ENV not in env, name
            assert env[CONTROL_PUBLIC_KEY_ENV] == str(keys.curator.public)
            assert env[DEADLINE_PUBLIC_KEY_ENV] == str(keys.deadline.public)
            assert (DEADLINE_KEY_ENV in env) == (name == "releaser"), name
    env = {k: v for k, v in os.environ.items() if "_CONTROL_" not in k and "_DEADLINE_" not in k}
    proc = subprocess.run(
        [sys.executable, "-m", "jobs.worker", "--config", path, "--loglevel", "warn"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert CONTROL_PUBLIC_KEY_ENV in proc.stderr and "forged" in proc.stderr


def test_a_signature_binds_deployment_fingerprint_step_action_and_close_time(tmp_path):
    keys = ensure_keys(tmp_path / "keys")
    curator = load_private(keys.curator.private)
    signer = CloseSigner(curator, "dep-a", "f" * 64, "close")
    from pipeline.stream.control.signing_keys import load_public

    verifier = CloseVerifier("dep-a", "f" * 64, {"close": load_public(keys.curator.public)})
    good = signer.sign(2, 1000)
    assert verifier.marker(good.marker()) == good
    for forged in (
        SignedClose(3, 1000, "close", good.signature),
        SignedClose(2, 1001, "close", good.signature),
        CloseSigner(curator, "dep-b", "f" * 64, "close").sign(2, 1000),
        CloseSigner(curator, "dep-a", "e" * 64, "close").sign(2, 1000),
        CloseSigner(curator, "dep-a", "f" * 64, "deadline").sign(2, 1000),
    ):
        with pytest.raises(Unverified) as err:
            verifier.marker(forged.marker())
        assert err.value.reason == "unauthenticated"
    # a command verifies only with a signature for every step it would close
    command = CloseCommand.parse(CloseCommand.signed(signer, range(2, 4), 1000).value())
    assert sorted(command.verified(verifier, 2)) == [2, 3]
    with pytest.raises(Unverified, match="no signature for step 1"):
        command.verified(verifier, 1)
    # a key file another user may read is refused
    keys.curator.private.chmod(0o640)
    with pytest.raises(ValueError, match="readable by other users"):
        load_private(keys.curator.private)
