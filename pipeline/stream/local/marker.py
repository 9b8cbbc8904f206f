"""The deployment marker: what a local deployment has released, kept outside its Redis directory.

``dpstream up`` writes ``$DPSTREAM_HOME/<deployment>/deployment.json`` (the instance id of the Redis
state and the last step it released) whenever that changes, and reads it before starting any
stream process. A marker saying that instance X released through step N, over a Redis that does
not know X (its directory was deleted, or replaced by another deployment's), means the state that
drew the noise of steps 1..N is gone: releasing again would draw fresh noise for steps already
public. ``up`` refuses that start with exit code 4 (state lost), independently of the releaser's
fence, which needs the ``releases`` topic (on the durable embedded log it has it too).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DeploymentMarker", "marker_path", "read_marker", "write_marker", "stateless_start"]


@dataclass(frozen=True)
class DeploymentMarker:
    instance: str
    released_step: int


def marker_path(deployment_dir: Path) -> Path:
    return Path(deployment_dir) / "deployment.json"


def read_marker(deployment_dir: Path) -> DeploymentMarker | None:
    try:
        data = json.loads(marker_path(deployment_dir).read_text())
        return DeploymentMarker(str(data["instance"]), int(data["released_step"]))
    except FileNotFoundError:
        return None
    except (ValueError, KeyError, TypeError) as err:
        raise ValueError(
            f"unreadable deployment marker {marker_path(deployment_dir)}: {err}"
        ) from err


def write_marker(deployment_dir: Path, marker: DeploymentMarker) -> None:
    path = marker_path(deployment_dir)
    partial = path.with_suffix(".json.partial")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(json.dumps({"instance": marker.instance, "released_step": marker.released_step}))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(partial, path)


def stateless_start(
    marker: DeploymentMarker | None, identity: dict | None, released: int
) -> str | None:
    """Why starting on this Redis state would redraw public noise (None: it would not)."""
    if marker is None or marker.released_step < 1:
        return None
    instance = (identity or {}).get("instance")
    if instance == marker.instance and released >= marker.released_step:
        return None
    found = (
        "holds no deployment state"
        if instance is None
        else f"is instance {instance}"
        + (f", released through step {released}" if instance == marker.instance else "")
    )
    return (
        f"instance {marker.instance} of this deployment released through step {marker.released_step}, but its "
        f"Redis state {found}: releasing again would draw fresh noise for steps already public"
    )
