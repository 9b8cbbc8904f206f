"""What `dpstream` imports, read from the modules a real run has loaded when it exits (not timed):
the parser (`--help`, `produce --help`) needs none of the heavy packages, and `produce` — a file
sent, or checked with `--dry-run`, against a running `dpstream up` — none that only other
commands use. A small file's `produce` spends most of its time importing
(docs/streaming.md, "A small file"); a module-level import that creeps back fails here."""

from __future__ import annotations

import json
import subprocess
import sys

from support.cli import deployment, running  # noqa: F401 - `deployment` is a fixture

# runs `python -m pipeline.cli ARGS` and writes the names of the modules loaded at exit to OUT
_RUN = """
import atexit, json, runpy, sys
out = sys.argv.pop(1)
atexit.register(lambda: open(out, "w").write(json.dumps(sorted(sys.modules))))
runpy.run_module("pipeline.cli", run_name="__main__", alter_sys=True)
"""

# the parser: clients, configuration models, data libraries (the commands import them when run)
NOT_FOR_THE_PARSER = (
    "pydantic",
    "yaml",
    "ssl",
    "cryptography",
    "kafka",
    "aiokafka",
    "redis",
    "numpy",
    "pyarrow",
    "matplotlib",
    "scipy",
    "pipeline.config",
    "pipeline.connections",
    "pipeline.security",
)
# produce: other commands' modules (the releaser's synthesizers, the analysts' tables, plots)
NOT_FOR_PRODUCE = (
    "aiokafka",
    "matplotlib",
    "scipy",
    "pipeline.synth",
    "pipeline.analyst",
    "pipeline.sim",
    "pipeline.plan",
    "pipeline.demo",
    "pipeline.stream.releaser",
    "pipeline.cli.plan_search",
)


def _loaded(tmp_path, *args, env=None) -> tuple[subprocess.CompletedProcess, set[str]]:
    out = tmp_path / "modules.json"
    run = subprocess.run(
        [sys.executable, "-c", _RUN, str(out), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    return run, set(json.loads(out.read_text()))


def _among(modules: set[str], packages) -> list[str]:
    return sorted(m for m in modules for p in packages if m == p or m.startswith(p + "."))


def test_the_parser_imports_no_client_and_no_configuration_model(tmp_path):
    """Before: `pipeline.cli` imported the connections (ssl, pydantic's models of the security
    block) for every command, `--help` included."""
    for args in (["--help"], ["produce", "--help"]):
        run, modules = _loaded(tmp_path, *args)
        assert run.returncode == 0 and "usage: " in run.stdout, run.stderr
        assert "pipeline.cli" in modules
        assert _among(modules, NOT_FOR_THE_PARSER) == [], args


def test_produce_imports_only_what_produce_needs(deployment, tmp_path):  # noqa: F811
    """Before: `produce --dry-run` imported the synthesizers and the analysts' tables (the
    public topics' reader, pipeline.consumer, imported them at module level)."""
    path, env = deployment
    cfg = ["--config", path]
    files = {}
    for step in (1, 2):
        files[step] = tmp_path / f"step{step}.csv"
        files[step].write_text(
            "user,step,poverty\n" + "".join(f"u{i},{step},{i % 2}\n" for i in range(100))
        )
    with running(path, env, tmp_path):
        sent, on_send = _loaded(tmp_path, "produce", *cfg, "--csv", files[1], env=env)
        assert sent.returncode == 0, sent.stderr
        assert "sent 100 reports for step 1" in sent.stdout and "100 accepted" in sent.stdout
        dry, on_dry = _loaded(tmp_path, "produce", *cfg, "--csv", files[2], "--dry-run", env=env)
        assert dry.returncode == 0 and "nothing sent" in dry.stdout, dry.stderr
    # what the runs did is what was recorded: the upload, the clients, the workers' verdict
    assert {"pipeline.upload", "pipeline.fates", "kafka", "redis", "pyarrow"} <= on_send
    assert {"pipeline.upload", "pipeline.held_reports", "kafka", "redis"} <= on_dry
    assert _among(on_send, NOT_FOR_PRODUCE) == []
    assert _among(on_dry, NOT_FOR_PRODUCE) == []
