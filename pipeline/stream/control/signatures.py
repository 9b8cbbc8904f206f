"""Signed closes: what a close marker and a close command carry so that only the curator can make
them.

A close of step t is a signed **statement** binding everything that decides what the close means::

    b"dpstream-close-v1\\n" + canonical JSON {"action", "closed_at", "deployment", "fingerprint",
    "step"}

``deployment`` is the deployment's name and ``fingerprint`` the sha256 of its privacy-relevant
configuration (:mod:`pipeline.stream.state.fingerprint`), so a signature made for one step, one
deployment or one configuration verifies for no other; ``closed_at`` is the public close time (ms)
the step's records are stamped with; ``action`` says which key signed it: ``close`` (the curator's
``dpstream close``) or ``deadline`` (the releaser's own deadline close, ``steps.close: deadline``),
each verified against its own public key (:mod:`pipeline.stream.control.signing_keys`).

The close marker on ``reports`` is the statement's fields with the signature (base64, 64 bytes), the
fields the worker does not know itself (``deployment`` and ``fingerprint`` it takes from its own
configuration)::

    {"step": t, "closed_at": ms, "action": "close", "signature": "<base64>"}

A close command on ``control`` carries one signed statement per step it closes (the curator signs
every step from the first not released through t, so the releaser has a marker for each step it
writes)::

    {"command": "close", "step": t, "closed_at": ms, "signatures": {"<s>": "<base64>", ...}}

The releaser keeps each step's marker bytes with its close (Redis, releaser only) and re-sends them
verbatim when it re-drives a lost close: no signing power is needed for that.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from pipeline.stream.control.signing_keys import (
    CONTROL_KEY_ENV,
    CONTROL_PUBLIC_KEY_ENV,
    DEADLINE_KEY_ENV,
    DEADLINE_PUBLIC_KEY_ENV,
    KeyUnavailable,
    env_path,
    load_private,
    load_public,
)
from pipeline.stream.state.identity import StateRefused

if TYPE_CHECKING:
    from pipeline.config import Deployment

__all__ = [
    "ACTIONS",
    "MAX_COMMAND_STEPS",
    "Unverified",
    "SignedClose",
    "CloseSigner",
    "CloseVerifier",
    "CloseCommand",
    "curator_signer",
    "deadline_signer",
    "job_keys",
    "ControlKeyRefused",
    "statement",
    "deployment_fingerprint",
]

ACTIONS = ("close", "deadline")
# ~97 bytes a step: a command stays below Kafka's default 1 MB message limit
MAX_COMMAND_STEPS = 8_000
_PREFIX = b"dpstream-close-v1\n"


class Unverified(ValueError):
    """A close marker or command that must not close anything; ``reason`` is its dead-letter reason
    (``unauthenticated``: no valid signature; ``malformed``: not a marker or command at all)."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


class ControlKeyRefused(StateRefused):
    """A stream process without the key it verifies (or signs deadline closes) with (exit code
    2)."""

    exit_code, label = 2, "configuration refused"


def statement(deployment: str, fingerprint: str, step: int, action: str, closed_at: int) -> bytes:
    """The bytes a close signature is over (see the module docstring)."""
    doc = {
        "action": action,
        "closed_at": int(closed_at),
        "deployment": deployment,
        "fingerprint": fingerprint,
        "step": int(step),
    }
    return _PREFIX + json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def deployment_fingerprint(deployment: Deployment, roster_ids: list[str]) -> str:
    """The fingerprint a signature binds: the deployment's own configuration's, computed here,
    never read
    from Redis (which the stream roles may write)."""
    from pipeline.stream.state.fingerprint import fingerprint, privacy_config

    return fingerprint(privacy_config(deployment, roster_ids))


@dataclass(frozen=True)
class SignedClose:
    step: int
    closed_at: int
    action: str
    signature: bytes

    def marker(self) -> bytes:
        """The close marker's value on ``reports``."""
        return orjson.dumps(
            {
                "step": self.step,
                "closed_at": self.closed_at,
                "action": self.action,
                "signature": base64.b64encode(self.signature).decode(),
            }
        )

    @classmethod
    def from_marker(cls, value: bytes) -> SignedClose:
        """The fields of a marker (not yet verified); :class:`Unverified` when they are not
        there."""
        msg = _json(value, "close marker")
        if type(msg) is not dict or type(msg.get("step")) is not int or msg["step"] < 1:
            raise Unverified("malformed", "close marker without a valid step")
        closed_at, action = msg.get("closed_at"), msg.get("action")
        if "signature" not in msg:
            raise Unverified(
                "unauthenticated",
                f"close marker for step {msg['step']} without a signature: only the "
                "curator's close command (or the releaser's deadline) makes markers",
            )
        if type(closed_at) is not int or closed_at < 0 or action not in ACTIONS:
            raise Unverified(
                "unauthenticated",
                f"close marker for step {msg['step']} without a valid closed_at and "
                f"action ({', '.join(ACTIONS)})",
            )
        return cls(
            msg["step"], closed_at, action, _signature(msg["signature"], f"step {msg['step']}")
        )


def _json(value: bytes, what: str) -> Any:
    try:
        return orjson.loads(value)
    except orjson.JSONDecodeError:
        raise Unverified("malformed", f"{what} whose value is not JSON") from None


def _signature(text: Any, where: str) -> bytes:
    try:
        raw = base64.b64decode(text, validate=True) if isinstance(text, str) else b""
    except (binascii.Error, ValueError):
        raw = b""
    if len(raw) != 64:
        raise Unverified("unauthenticated", f"{where}: the signature is not 64 bytes of base64")
    return raw


class CloseSigner:
    """Signs closes of one deployment under one configuration with one key (``action`` names
    which)."""

    def __init__(self, key: Ed25519PrivateKey, deployment: str, fingerprint: str, action: str):
        if action not in ACTIONS:
            raise ValueError(f"action must be one of {ACTIONS}, got {action!r}")
        self.key, self.deployment, self.fingerprint, self.action = (
            key,
            deployment,
            fingerprint,
            action,
        )

    def sign(self, step: int, closed_at: int) -> SignedClose:
        body = statement(self.deployment, self.fingerprint, step, self.action, closed_at)
        return SignedClose(int(step), int(closed_at), self.action, self.key.sign(body))


class CloseVerifier:
    """Checks markers and commands against the public keys of the actions this deployment
    accepts."""

    def __init__(self, deployment: str, fingerprint: str, keys: dict[str, Ed25519PublicKey]):
        self.deployment, self.fingerprint, self.keys = deployment, fingerprint, dict(keys)

    @classmethod
    def from_environment(cls, deployment: Deployment, fingerprint: str) -> CloseVerifier:
        """The verifier of a stream process: the curator's public key always; the deadline key's
        when the
        deployment closes on a deadline. :class:`KeyUnavailable` naming the variable when one is
        missing."""
        keys = {"close": load_public(_required(CONTROL_PUBLIC_KEY_ENV, "the curator's public key"))}
        if deployment.steps.close == "deadline":
            keys["deadline"] = load_public(
                _required(
                    DEADLINE_PUBLIC_KEY_ENV, "the deadline public key (steps.close: deadline)"
                ),
                "deadline public key",
            )
        return cls(deployment.name, fingerprint, keys)

    def check(self, signed: SignedClose) -> SignedClose:
        key = self.keys.get(signed.action)
        if key is None:
            raise Unverified(
                "unauthenticated",
                f"close marker for step {signed.step} signed for action "
                f"{signed.action!r}, which this deployment does not accept",
            )
        try:
            key.verify(
                signed.signature,
                statement(
                    self.deployment, self.fingerprint, signed.step, signed.action, signed.closed_at
                ),
            )
        except InvalidSignature:
            raise Unverified(
                "unauthenticated",
                f"close of step {signed.step}: the signature does not verify for "
                f"deployment {self.deployment!r} under this configuration with the "
                f"{signed.action} key (forged, replayed from another step or "
                "deployment, or signed with a rotated-out key)",
            ) from None
        return signed

    def marker(self, value: bytes) -> SignedClose:
        """A verified close marker, or :class:`Unverified`."""
        return self.check(SignedClose.from_marker(value))


@dataclass(frozen=True)
class CloseCommand:
    """A close command: close every step through ``step`` at ``closed_at``, one signed statement
    per step."""

    step: int
    closed_at: int
    signatures: dict[int, bytes]

    @classmethod
    def signed(cls, signer: CloseSigner, steps: range, closed_at: int) -> CloseCommand:
        if len(steps) > MAX_COMMAND_STEPS:
            raise ValueError(
                f"steps: {len(steps):,} signatures in one command, at most {MAX_COMMAND_STEPS:,}"
            )
        return cls(
            steps.stop - 1, closed_at, {t: signer.sign(t, closed_at).signature for t in steps}
        )

    def value(self) -> bytes:
        return orjson.dumps(
            {
                "command": "close",
                "step": self.step,
                "closed_at": self.closed_at,
                "signatures": {
                    str(t): base64.b64encode(s).decode() for t, s in sorted(self.signatures.items())
                },
            }
        )

    @classmethod
    def parse(cls, value: bytes) -> CloseCommand:
        msg = _json(value, "control message")
        if type(msg) is not dict or msg.get("command") != "close":
            what = msg.get("command") if type(msg) is dict else msg
            raise Unverified("malformed", f"unknown control command {what!r}")
        step, closed_at, sigs = msg.get("step"), msg.get("closed_at"), msg.get("signatures")
        if type(step) is not int or step < 1:
            raise Unverified("malformed", "close command without a valid step")
        if type(closed_at) is not int or closed_at < 0 or type(sigs) is not dict:
            raise Unverified(
                "unauthenticated",
                f"close command for step {step} without a signed closed_at: only "
                "the curator's `dpstream close` makes close commands",
            )
        out = {}
        for key, text in sigs.items():
            if not key.isdigit():
                raise Unverified(
                    "malformed", f"close command: signatures key {key!r} is not a step"
                )
            out[int(key)] = _signature(text, f"close command, step {key}")
        return cls(step, closed_at, out)

    def verified(self, verifier: CloseVerifier, first: int) -> dict[int, SignedClose]:
        """The signed closes of steps ``first``..``step`` (each verified), or
        :class:`Unverified`."""
        out = {}
        for t in range(first, self.step + 1):
            if t not in self.signatures:
                raise Unverified(
                    "unauthenticated",
                    f"close command through step {self.step} carries no signature "
                    f"for step {t}, which it would close",
                )
            out[t] = verifier.check(SignedClose(t, self.closed_at, "close", self.signatures[t]))
        return out


def _required(variable: str, what: str):
    path = env_path(variable)
    if path is None:
        raise KeyUnavailable(
            f"{variable} is not set: {what} is needed to tell the curator's closes from "
            "forged ones "
            '(`dpstream up` sets it; docs/security.md, "The control plane")'
        )
    return path


def curator_signer(deployment: Deployment, roster_ids: list[str]) -> CloseSigner:
    """The curator's signer (``dpstream close``): its key from ``DPSTREAM_CONTROL_KEY``, else the
    one the
    running ``dpstream up`` of the deployment generated."""
    from pipeline.stream.local.cluster import curator_key_path

    path = curator_key_path(deployment.name)
    if path is None:
        raise KeyUnavailable(
            f"{CONTROL_KEY_ENV} is not set and no `dpstream up` of deployment {deployment.name!r} "
            "names a curator key: only the curator's key closes steps (docs/security.md)"
        )
    return CloseSigner(
        load_private(path, "curator key"),
        deployment.name,
        deployment_fingerprint(deployment, roster_ids),
        "close",
    )


def deadline_signer(deployment: Deployment, fingerprint: str) -> CloseSigner | None:
    """The releaser's deadline signer when the deployment closes on a deadline (None otherwise)."""
    if deployment.steps.close != "deadline":
        return None
    path = _required(DEADLINE_KEY_ENV, "the deadline private key (steps.close: deadline)")
    return CloseSigner(load_private(path, "deadline key"), deployment.name, fingerprint, "deadline")


def job_keys(
    deployment: Deployment, fingerprint: str, role: str
) -> tuple[CloseVerifier, CloseSigner | None]:
    """A stream process's verifier (and, for the releaser of a deadline deployment, its deadline
    signer);
    a missing or unusable key refuses the start with exit code 2, naming the variable or file."""
    try:
        verifier = CloseVerifier.from_environment(deployment, fingerprint)
        signer = deadline_signer(deployment, fingerprint) if role == "releaser" else None
    except KeyUnavailable as err:
        raise ControlKeyRefused(f"{role}: {err}") from None
    return verifier, signer
