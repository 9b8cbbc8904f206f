"""The deployment descriptor carries the public keys the workers verify close markers with
(pipeline.descriptor, docs/topics.md "deployment"), so that `produce --dry-run` checks markers as
the workers do: the curator's key always, the deadline key with `steps.close: deadline`; the same
bytes from two builds under the same configuration and keys; a marker verifies with the published
keys exactly when it verifies with the workers' own verifier."""

from __future__ import annotations

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from pipeline import descriptor
from pipeline.config import parse_config
from pipeline.stream.control.signatures import CloseSigner, CloseVerifier, Unverified
from pipeline.stream.state.fingerprint import fingerprint, privacy_config

IDS = [f"u{i}" for i in range(10)]


def _deployment(close: str = "control"):
    steps = {"close": close, "deadline_seconds": 60} if close == "deadline" else {}
    return parse_config({"name": "keys", "broker": "k:9092", "redis": "redis://r:6379/0",
                         "roster": {"size": len(IDS)}, "horizon": 3, "steps": steps,
                         "attributes": {"pov": {"type": "binary"}}, "budget": {"rho": 0.5},
                         "releases": [{"name": "cu", "type": "cumulative", "attribute": "pov",
                                       "share": 1.0}]})


def test_the_descriptor_publishes_the_curators_key_and_stays_the_same_bytes():
    dep = _deployment()
    curator = Ed25519PrivateKey.generate()
    keys = {"close": curator.public_key()}
    first = descriptor.encode(descriptor.build(dep, IDS, "inst", keys))
    again = descriptor.encode(descriptor.build(dep, IDS, "inst", dict(keys)))
    assert first == again
    published = orjson.loads(first)
    assert set(published["close_keys"]) == {"close"}
    assert published["close_keys"]["close"].startswith("-----BEGIN PUBLIC KEY-----\n")
    # a rotated key is a different record (the last one is the one read)
    rotated = {"close": Ed25519PrivateKey.generate().public_key()}
    assert descriptor.encode(descriptor.build(dep, IDS, "inst", rotated)) != first

    verifier = descriptor.close_verifier(published)
    assert verifier is not None
    digest = fingerprint(privacy_config(dep, IDS))
    assert published["fingerprint"] == digest
    real = CloseSigner(curator, dep.name, digest, "close").sign(2, 1_000).marker()
    assert verifier.marker(real).step == 2
    workers = CloseVerifier(dep.name, digest, keys)  # what the workers hold from their files
    forged = CloseSigner(Ed25519PrivateKey.generate(), dep.name, digest, "close").sign(2, 1_000)
    unsigned = orjson.dumps({"step": 2, "closed_at": 1_000, "action": "close"})
    for check in (verifier, workers):
        for bad in (forged.marker(), unsigned):
            with pytest.raises(Unverified) as err:
                check.marker(bad)
            assert err.value.reason == "unauthenticated"


def test_a_deadline_deployment_publishes_the_deadline_key_too():
    dep = _deployment("deadline")
    curator, deadline = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    keys = {"close": curator.public_key(), "deadline": deadline.public_key()}
    published = orjson.loads(descriptor.encode(descriptor.build(dep, IDS, "inst", keys)))
    assert set(published["close_keys"]) == {"close", "deadline"}
    verifier = descriptor.close_verifier(published)
    digest = published["fingerprint"]
    closed = CloseSigner(deadline, dep.name, digest, "deadline").sign(1, 5).marker()
    assert verifier is not None and verifier.marker(closed).step == 1


def test_a_descriptor_without_keys_gives_no_verifier_and_a_bad_key_is_named():
    dep = _deployment()
    published = descriptor.build(dep, IDS, "inst", {"close": Ed25519PrivateKey.generate()
                                                     .public_key()})
    older = {k: v for k, v in published.items() if k != "close_keys"}
    assert descriptor.close_verifier(older) is None
    with pytest.raises(ValueError, match="close_keys.close is not a PEM public key"):
        descriptor.close_verifier(dict(published, close_keys={"close": "not a key"}))


def test_the_dry_run_takes_the_last_published_keys_and_says_when_there_are_none():
    """Against a real broker: no descriptor, then one from a releaser before the keys, then a
    record that is no descriptor (the dry run says the markers' signatures were not checked, and
    why), then two with keys: the last one
    (after a rotation, the new key) is the one markers are checked with."""
    from kafka import KafkaProducer

    from pipeline.held_reports import HeldReports, published_verifier
    from pipeline.stream.kafka.topics import ensure_topics
    from pipeline.stream.local.embedded import EmbeddedBroker

    broker = EmbeddedBroker().start()
    try:
        dep = _deployment().model_copy(update={"broker": broker.bootstrap})
        names = ensure_topics(broker.bootstrap, dep)
        verifier, why = published_verifier(dep, broker.bootstrap)
        assert verifier is None and why == f"no deployment descriptor on {names['deployment']}"
        note = HeldReports(0, unverified=why).note
        assert "the close markers' signatures were not checked (no deployment descriptor" in note

        old, new = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
        producer = KafkaProducer(bootstrap_servers=broker.bootstrap)

        def publish(keys) -> None:
            record = descriptor.build(dep, IDS, "inst", keys)
            if not keys:
                del record["close_keys"]
            producer.send(names["deployment"], descriptor.encode(record), key=b"descriptor",
                          partition=0).get(timeout=30)

        publish({})
        verifier, why = published_verifier(dep, broker.bootstrap)
        assert verifier is None and "has no close_keys" in why
        producer.send(names["deployment"], b"[1]", partition=0).get(timeout=30)
        verifier, why = published_verifier(dep, broker.bootstrap)
        assert verifier is None and why.endswith("the descriptor is not a JSON object")
        publish({"close": old.public_key()})
        publish({"close": new.public_key()})
        producer.close()
        verifier, why = published_verifier(dep, broker.bootstrap)
    finally:
        broker.stop()
    assert verifier is not None and why is None
    digest = fingerprint(privacy_config(dep, IDS))
    assert verifier.marker(CloseSigner(new, dep.name, digest, "close").sign(1, 7).marker())
    with pytest.raises(Unverified):
        verifier.marker(CloseSigner(old, dep.name, digest, "close").sign(1, 7).marker())
