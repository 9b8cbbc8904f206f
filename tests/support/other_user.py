"""A second local user for adversary tests: a system account, and code run under its uid.

Only root can make the account and switch to it; without root the tests that need it skip. The code runs
in a forked child after ``setuid``: it uses the modules the test process already imported (the test's
interpreter lives where the second user may not read) and sends back a JSON-able result.
"""

from __future__ import annotations

import ctypes
import encodings.idna  # noqa: F401 - host names in socket calls; the child may not read the stdlib
import json
import os
import pwd
import subprocess
from collections.abc import Callable
from typing import Any

NAME = "dpstream-intruder"
PR_SET_DUMPABLE = 4


def other_user() -> pwd.struct_passwd | None:
    """The second user (created if missing), or None when this process cannot make or become one."""
    if os.geteuid() != 0:
        return None
    try:
        return pwd.getpwnam(NAME)
    except KeyError:
        made = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", NAME],
                              capture_output=True, text=True, check=False)
        if made.returncode != 0 and "already exists" not in made.stderr:
            return None
        return pwd.getpwnam(NAME)


def run_as(user: pwd.struct_passwd, probe: Callable[..., Any], *args: Any) -> Any:
    """``probe(*args)`` in a child running as ``user`` (no supplementary groups); its return value."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 0
        try:
            os.close(read_end)
            os.setgroups([])
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)
            # dumpable again, as any process the user starts: a setuid clears it, leaving /proc/self root's
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
            result = {"value": probe(*args)}
        except BaseException as err:  # noqa: BLE001 - reported to the test
            result, code = {"error": f"{type(err).__name__}: {err}"}, 1
        with os.fdopen(write_end, "w") as out:
            json.dump(result, out)
        os._exit(code)
    os.close(write_end)
    with os.fdopen(read_end) as answer:
        text = answer.read()
    os.waitpid(pid, 0)
    result = json.loads(text or '{"error": "the child said nothing"}')
    if "error" in result:
        raise AssertionError(f"the probe as {user.pw_name} failed: {result['error']}")
    return result["value"]
