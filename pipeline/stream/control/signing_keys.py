"""The control plane's key pairs (Ed25519) and where each process finds its half.

Two pairs, each a PEM private key (PKCS#8, owner-only) and its public key (SubjectPublicKeyInfo):

* the **curator key** signs close commands (``dpstream close``). Only the curator's own commands
read
  its private half; the workers and the releaser get the public half and verify;
* the **deadline key** signs the closes the releaser makes itself when a deployment closes on a
  deadline (``steps.close: deadline``). Only the releaser reads its private half, and only in such a
  deployment; the workers verify with the public half.

A producer, a worker or another local user holds neither private half, so none of them can write a
close marker or a control command a worker or the releaser accepts (docs/security.md, "The control
plane"). ``dpstream up`` generates both pairs once in ``$DPSTREAM_HOME/<deployment>/control/`` (kept
with the deployment's state: markers stored for a re-drive verify after a restart) and hands each
process the paths through these variables; a deployment run without ``up`` sets them itself:

  DPSTREAM_CONTROL_KEY              the curator's private key (the operator's commands)
  DPSTREAM_CONTROL_PUBLIC_KEY       its public key (workers, releaser; required)
  DPSTREAM_DEADLINE_KEY             the deadline private key (the releaser, steps.close: deadline)
  DPSTREAM_DEADLINE_PUBLIC_KEY      its public key (workers; required with steps.close: deadline)
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

__all__ = [
    "CONTROL_KEY_ENV",
    "CONTROL_PUBLIC_KEY_ENV",
    "DEADLINE_KEY_ENV",
    "DEADLINE_PUBLIC_KEY_ENV",
    "PRIVATE_ENVS",
    "KeyUnavailable",
    "KeyPair",
    "ControlKeys",
    "ensure_keys",
    "load_private",
    "load_public",
    "env_path",
]

CONTROL_KEY_ENV = "DPSTREAM_CONTROL_KEY"
CONTROL_PUBLIC_KEY_ENV = "DPSTREAM_CONTROL_PUBLIC_KEY"
DEADLINE_KEY_ENV = "DPSTREAM_DEADLINE_KEY"
DEADLINE_PUBLIC_KEY_ENV = "DPSTREAM_DEADLINE_PUBLIC_KEY"
PRIVATE_ENVS = (
    CONTROL_KEY_ENV,
    DEADLINE_KEY_ENV,
)  # never inherited by a process that must not sign


class KeyUnavailable(ValueError):
    """A key file is missing, unreadable, not a key of the right kind, or readable by other users;
    the
    message names the variable or file, never key material."""


@dataclass(frozen=True)
class KeyPair:
    private: Path
    public: Path


@dataclass(frozen=True)
class ControlKeys:
    """The two pairs of a deployment, in one owner-only directory."""

    directory: Path

    @property
    def curator(self) -> KeyPair:
        return KeyPair(self.directory / "curator.key", self.directory / "curator.pub")

    @property
    def deadline(self) -> KeyPair:
        return KeyPair(self.directory / "deadline.key", self.directory / "deadline.pub")

    def public_env(self) -> dict[str, str]:
        """What a worker (and the releaser) is given: the public halves only."""
        return {
            CONTROL_PUBLIC_KEY_ENV: str(self.curator.public),
            DEADLINE_PUBLIC_KEY_ENV: str(self.deadline.public),
        }


def ensure_keys(directory: Path) -> ControlKeys:
    """The deployment's key pairs in ``directory`` (0700), each generated on first use and kept
    after."""
    from pipeline.stream.local.embedded import private_dir, private_file

    keys = ControlKeys(private_dir(Path(directory)))
    for pair in (keys.curator, keys.deadline):
        if not pair.private.exists():
            key = Ed25519PrivateKey.generate()
            private_file(
                pair.private,
                key.private_bytes(
                    serialization.Encoding.PEM,
                    serialization.PrivateFormat.PKCS8,
                    serialization.NoEncryption(),
                ).decode(),
            )
        public = load_private(pair.private).public_key()
        pair.public.write_bytes(
            public.public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )
    return keys


def env_path(variable: str) -> Path | None:
    value = os.environ.get(variable)
    return Path(value) if value else None


def _read(path: Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise KeyUnavailable(f"{what}: cannot read {path} ({err.strerror})") from None


def load_private(path: Path, what: str = "control key") -> Ed25519PrivateKey:
    """A private key from an owner-only file: one of this user's that others may read is refused,
    as ssh
    does (a key owned by another user is a mounted secret, e.g. a Kubernetes Secret with
    ``fsGroup``, whose
    access the platform decides)."""
    try:
        info = Path(path).stat()
    except OSError as err:
        raise KeyUnavailable(f"{what}: cannot read {path} ({err.strerror})") from None
    mode = info.st_mode
    if info.st_uid == os.getuid() and mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyUnavailable(
            f"{what}: {path} is readable by other users (mode {oct(mode & 0o777)}); "
            "`chmod 600` it, and rotate the key if anyone may have copied it (docs/security.md)"
        )
    try:
        key = serialization.load_pem_private_key(_read(path, what), password=None)
    except (ValueError, TypeError) as err:
        raise KeyUnavailable(
            f"{what}: {path} is not an unencrypted PEM private key ({err})"
        ) from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyUnavailable(f"{what}: {path} is not an Ed25519 key")
    return key


def load_public(path: Path, what: str = "control public key") -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(_read(path, what))
    except ValueError as err:
        raise KeyUnavailable(f"{what}: {path} is not a PEM public key ({err})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyUnavailable(f"{what}: {path} is not an Ed25519 key")
    return key
