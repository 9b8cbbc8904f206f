"""The commands around the answers, against one running deployment (`dpstream up`: real embedded
broker, Redis, worker and releaser) that closes on a deadline, with a roster file and a hashed
attribute every user holds the same value of:

* the analysts' commands need only the broker and the deployment's name, or a configuration whose
  roster file is absent (the published descriptor gives n, labels and parameters), and refuse a
  configuration that is not the deployment's;
* the operator's `close`, `status`, `plan`, `dead-letters` and `down` refuse a configuration that is
  not the deployment's (a deployment not started yet is planned whatever its file says);
* a manual `close` of a deadline deployment is refused without --force;
* hashed heavy hitters are named from a list of candidate names, `dpstream hash` gives a name's
  code,
  `alerts --follow` and a faust-streaming agent (docs/examples/) see a new step's alert live;
* `alerts` into a closed pipe ends quietly; `--version`.

The in-process commands run through ``pipeline.cli.main`` (a subprocess each would spend most of the
test starting Python); those that must be separate processes (a follower, a closed pipe) are."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
import yaml

from pipeline.attributes import public_hash
from pipeline.cli import main
from pipeline.stream.local.broker_tls import BROKER_TLS_ENV
from support.cli import running

N, T, NAME = 600, 4, "public-analyst"
SIZE = 65536
EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "alerts_faust_agent.py"


def _config(roster: Path, rho: float = 0.5) -> dict:
    return {
        "name": NAME, "roster": {"source": "file", "path": str(roster)}, "horizon": T,
        "topics": {"partitions": 1},
        "steps": {"unit": "month", "close": "deadline", "deadline_seconds": 3600},
        "attributes": {"poverty": {"type": "binary", "label": "poor"},
                       "item": {"type": "hashed", "size": SIZE, "description": "product bought"}},
        "budget": {"rho": rho, "epsilon": 2.0, "delta": 1e-6},
        "random": {"kind": "seeded", "seed": 5},
        "releases": [
            {"name": "quarterly", "type": "fixed_window", "attribute": "poverty", "window": 2,
             "share": 0.5},
            {"name": "cumulative", "type": "cumulative", "attribute": "poverty", "share": 0.5},
            # τ = 501 of n = 600 at this budget: "sku-1", held by everyone, is flagged until its
            # flags run out
            {"name": "items", "type": "heavy_hitters", "attribute": "item", "method": "tct", "k": 2,
             "share": 1.0},
        ],
    }


def dpstream(*args) -> SimpleNamespace:
    """``dpstream ARGS`` in this process: returncode, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in args])
        except SystemExit as exit_:
            code = exit_.code
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def ok(*args) -> str:
    proc = dpstream(*args)
    assert proc.returncode == 0, (args, proc.stderr[-2000:])
    return proc.stdout


def _produce(config: Path, tmp: Path, step: int) -> None:
    f = tmp / f"step{step}.csv"
    with f.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["user", "step", "poverty", "item"])
        w.writerows([f"u{i}", step, int(i % 5 == 0), "sku-1"] for i in range(N))
    assert f"sent {N} reports for step {step}" in ok("produce", "--config", config, "--csv", f)


def _published(config: Path) -> int:
    return json.loads(ok("status", "--config", config, "--json", "--wait", "1"))["published_step"]


def _wait_published(config: Path, step: int, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while _published(config) < step:
        assert time.monotonic() < deadline, f"step {step} not published within {timeout} s"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """`dpstream up` with steps 1..T-1 released (closed with --force: a deadline deployment)."""
    tmp = tmp_path_factory.mktemp("public-analyst")
    roster = tmp / "roster.txt"
    roster.write_text("".join(f"u{i}\n" for i in range(N)))
    config = tmp / "deployment.yaml"
    config.write_text(yaml.safe_dump(_config(roster)))
    home = str(tmp / "home")
    old_home = os.environ.get("DPSTREAM_HOME")
    os.environ["DPSTREAM_HOME"] = home  # the in-process commands find the `up` through it
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    try:
        with running(config, env, tmp) as broker:
            for t in range(1, T):
                _produce(config, tmp, t)
                ok("close", "--config", config, "--step", t, "--force")
            _wait_published(config, T - 1)
            yield SimpleNamespace(broker=broker, config=config, roster=roster, tmp=tmp, env=env,
                                  public=["--broker", broker, "--deployment", NAME])
    finally:
        if old_home is None:
            os.environ.pop("DPSTREAM_HOME", None)
        else:
            os.environ["DPSTREAM_HOME"] = old_home


def _other_config(d, name: str, **changes) -> Path:
    cfg = _config(d.roster)
    for key, value in changes.items():
        section, _, field = key.partition(".")
        cfg[section] = dict(cfg[section], **{field: value}) if field else value
    path = d.tmp / name
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_analyst_commands_need_only_the_broker_and_the_deployment_name(deployment, tmp_path,
                                                                        monkeypatch):
    d = deployment
    import redis

    def no_redis(*args, **kw):
        raise AssertionError("an analyst's command sent a Redis command")

    monkeypatch.setattr(redis.Redis, "execute_command", no_redis)
    monkeypatch.setenv("DPSTREAM_HOME", str(tmp_path / "analyst-home"))  # no `up` record to read
    # the broker and the name, nothing else: n, labels and bounds from the published descriptor
    text = ok("query", *d.public, "--release", "quarterly", "--step", 2)
    assert "poor in all 2 months (11)" in text and "shares are of n = 600 users" in text
    answer = json.loads(ok("query", *d.public, "--release", "cumulative", "--step", 3, "--json"))
    assert all(row["share"] == pytest.approx(row["estimate"] / N) for row in answer["rows"])
    ok("export", *d.public, "--release", "quarterly", "--out", tmp_path / "q.parquet")
    meta = json.loads(pq.read_table(tmp_path / "q.parquet").schema.metadata[b"dpstream"])
    assert meta["n"] == N and meta["released_through"] == T - 1 and meta["unit"] == "month"
    assert "flagged: code" in ok("alerts", *d.public)
    ok("report", *d.public, "--out", tmp_path / "page")
    page = (tmp_path / "page" / "report.html").read_text()
    assert f"n = {N:,} users" in page
    # the page tables every released month, not only the latest
    through = json.loads(ok("alerts", *d.public, "--json"))["alerts"][-1]["step"]
    quarterly = page.split('<h2 id="quarterly">')[1].split("<h2")[0]
    months = [int(t) for t in re.findall(r"<h3>month (\d+)", quarterly)]
    assert months == list(range(through, 1, -1))
    # a negative estimate (noise around a true 0: nobody is poor in exactly one of two months) is
    # shown with the interval clipped at 0 and why, never silently outside its interval
    rows = [r for t in range(2, through + 1)
            for r in json.loads(ok("query", *d.public, "--release", "quarterly", "--step", t,
                                   "--json"))["rows"]]
    negative = [r for r in rows if r["estimate"] < 0]
    assert negative, "no negative estimate with this seed: the check below would be vacuous"
    assert quarterly.count("(clipped at 0, see below)") == len(negative)
    assert "A negative estimate (red) is noise around a small true count" in quarterly

    # an analyst's copy of the configuration without the curator's roster file
    absent = _other_config(d, "no-roster.yaml", broker=d.broker,
                           roster={"source": "file", "path": str(tmp_path / "absent.txt")})
    text = ok("query", "--config", absent, "--release", "quarterly", "--step", 3)
    assert "shares are of n = 600 users" in text
    ok("export", "--config", absent, "--release", "cumulative", "--out", tmp_path / "c.csv")
    assert json.loads((tmp_path / "c.csv.dictionary.json").read_text())["n"] == N
    ok("alerts", "--config", absent)
    ok("report", "--config", absent, "--out", tmp_path / "page2")

    # a configuration that is not the deployment's is refused, its differing key named
    other = _other_config(d, "other-rho.yaml", broker=d.broker, **{"budget.rho": 0.6})
    proc = dpstream("query", "--config", other, "--release", "quarterly", "--step", 2)
    assert proc.returncode == 2 and "budget.rho: 0.5 -> 0.6" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    proc = dpstream("query", "--broker", d.broker, "--deployment", "no-such-deployment",
                    "--release", "quarterly", "--step", 1)
    assert proc.returncode == 2 and proc.stderr == (
        f'dpstream: no deployment "no-such-deployment" on broker {d.broker} '
        "(topic dpstream.no-such-deployment.deployment does not exist)\n"), proc.stderr


def test_operator_commands_refuse_a_configuration_that_is_not_the_deployments(deployment):
    d = deployment
    other = _other_config(d, "rho.yaml", **{"budget.rho": 0.6})
    before = json.loads(ok("status", "--config", d.config, "--json", "--wait", "1"))
    # plan, dead-letters and down too: a plan of another file read as the deployment's, or a `down`
    # of a deployment the file does not describe (stopped here, the fixture's checks would fail)
    for command in (["status"], ["close", "--step", T, "--force"], ["plan"], ["plan", "--json"],
                    ["dead-letters"], ["down", "--wait", 30]):
        proc = dpstream(*command, "--config", other)
        assert proc.returncode == 2, (command, proc.stdout, proc.stderr)
        assert "budget.rho: 0.5 -> 0.6" in proc.stderr
        assert proc.stdout == ""  # no spend, budget or count printed for the wrong configuration
    after = json.loads(ok("status", "--config", d.config, "--json", "--wait", "1"))
    assert after["closing_step"] == before["closing_step"] == T - 1  # the refusal closed nothing
    # the deployment's own file passes; a deployment not started yet is planned whatever it says
    ok("plan", "--config", d.config)
    ok("dead-letters", "--config", d.config)
    new = d.tmp / "not-started.yaml"
    new.write_text(yaml.safe_dump(dict(_config(d.roster, rho=0.6), name="not-started")))
    ok("plan", "--config", new)


def test_a_manual_close_of_a_deadline_deployment_needs_force(deployment):
    d = deployment
    proc = dpstream("close", "--config", d.config, "--step", T)
    assert proc.returncode == 3 and "refusing a manual close" in proc.stderr
    assert "--force" in proc.stderr
    time.sleep(1)
    status = json.loads(ok("status", "--config", d.config, "--json", "--wait", "1"))
    assert status["closing_step"] == T - 1  # step T is still open


def test_hashed_heavy_hitters_are_named_from_a_list_of_names(deployment, tmp_path):
    d = deployment
    names = tmp_path / "names.txt"
    names.write_text("sku-0\nsku-1\nsku-2\n")
    code = public_hash("sku-1", SIZE)
    assert ok("hash", *d.public, "sku-1").split() == [str(code), "sku-1"]
    assert json.loads(ok("hash", *d.public, "--names", names, "--json"))["codes"]["sku-1"] == code
    plain = ok("alerts", *d.public)
    assert f"code {code} (noisy count" in plain
    named = ok("alerts", *d.public, "--names", names)
    assert f"code {code}" not in named and "sku-1 (noisy count" in named
    assert "flag 2 of k = 2: its users' flags are now spent" in named
    # the wording: a falling count after the flags ran out is not a falling popularity
    assert "is not a falling popularity" in named
    proc = dpstream("alerts", *d.public, "--names", tmp_path / "missing.txt")
    assert proc.returncode == 2 and "--names" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


class _Lines:
    """A process's stdout lines as it writes them, read by a thread. (Waiting with select() on the
    pipe and reading with the buffered readline() lost lines: one readline takes in every line
    already in the pipe and returns the first; the others wait unseen until the process writes
    again. Under load the reader falls behind and lines arrive together, so a follower's
    "following:" line, its last until a new step, waited for ever; so did the agent's third alert.)"""

    def __init__(self, proc: subprocess.Popen):
        self.proc, self.seen = proc, []
        self._arrived = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            with self._arrived:
                self.seen.append(line)
                self._arrived.notify_all()

    def until(self, needle: str, timeout: float) -> None:
        """Wait until a line contains ``needle``."""
        deadline = time.monotonic() + timeout
        with self._arrived:
            while not any(needle in line for line in self.seen):
                left = deadline - time.monotonic()
                assert left > 0, f"{needle!r} not in {timeout} s: {''.join(self.seen[-30:])}"
                assert self.proc.poll() is None, \
                    f"exited {self.proc.returncode}: {''.join(self.seen[-30:])}"
                self._arrived.wait(min(left, 0.5))


def test_the_line_reader_sees_lines_written_together():
    """The reader of the live test below: three lines in one write, read after they arrived."""
    script = "import sys, time; sys.stdout.write('a\\nb\\nc\\n'); sys.stdout.flush(); time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)  # the reader falls behind, as under load
        lines = _Lines(child)
        lines.until("c", 10)
        assert lines.seen == ["a\n", "b\n", "c\n"]
    finally:
        child.kill()
        child.wait()


def test_alerts_follow_and_a_faust_agent_see_a_new_step_live(deployment, tmp_path):
    pytest.importorskip("faust")
    d = deployment
    cli = [sys.executable, "-m", "pipeline.cli", "alerts", *d.public]
    # the gate's client files, which `running` put in this process's environment after d.env was made
    tls = {BROKER_TLS_ENV: os.environ.get(BROKER_TLS_ENV, "")}
    follower = subprocess.Popen(cli + ["--follow"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=dict(d.env, **tls), start_new_session=True)
    agent_env = dict(d.env, DPSTREAM_ALERTS_BOOTSTRAP=d.broker, DPSTREAM_ALERTS_DEPLOYMENT=NAME,
                     DPSTREAM_ALERTS_DATADIR=str(tmp_path / "faust"),
                     DPSTREAM_ALERTS_OUT=str(tmp_path / "a.jsonl"),
                     DPSTREAM_ALERTS_TLS_DIR=tls[BROKER_TLS_ENV])
    agent = subprocess.Popen([sys.executable, str(EXAMPLE), "worker", "-l", "warn"],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                             env=agent_env, cwd=tmp_path, start_new_session=True)
    followed, agent_lines = _Lines(follower), _Lines(agent)
    try:
        followed.until("following: new alerts below", 120)  # reads every past step first
        agent_lines.until(f"step {T - 1} items:", 120)  # joins its group, reads from the start
        _produce(d.config, d.tmp, T)
        ok("close", "--config", d.config, "--step", T, "--force")
        followed.until(f"step   {T}  items:", 60)
        agent_lines.until(f"step {T} items:", 60)
    finally:
        for proc in (follower, agent):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
        follower_rc = follower.wait(timeout=30)
        agent.wait(timeout=60)
    assert follower_rc == 0 and "Traceback" not in follower.stderr.read()
    live = followed.seen[followed.seen.index(next(x for x in followed.seen if "following:" in x)):]
    new = [x for x in live if x.startswith("step")]
    assert new == [x for x in live if f"step   {T}" in x]  # after "following": only the new step
    received = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert [r["key"] for r in received] == [f"items:{t}" for t in range(1, T + 1)]  # once each
    code = str(public_hash("sku-1", SIZE))
    assert received[0]["alert"]["flagged"] == [int(code)] and "flag 1" in received[0]["line"]


def test_alerts_into_a_closed_pipe_end_quietly(deployment):
    d = deployment
    read, write = os.pipe()
    os.close(read)  # the reader is gone before anything is written, as `| head` after its lines
    try:
        proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "alerts", "--config",
                               str(d.config)], stdout=write, stderr=subprocess.PIPE, text=True,
                              env=d.env, timeout=120)
    finally:
        os.close(write)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


def test_up_lists_its_metrics_ports_for_prometheus_and_only_the_releaser_exports_the_released_step(
        deployment, tmp_path):
    """A real Prometheus finds every process through the file_sd file `up` writes (the ports are
    random), and the released step it scrapes is the releaser's alone (a worker exported 0)."""
    from support.prometheus import Prometheus

    d = deployment
    targets = Path(d.env["DPSTREAM_HOME"]) / f"{NAME}.prometheus.json"
    groups = json.loads(targets.read_text())
    assert sorted(g["labels"]["process"] for g in groups) == ["releaser", "worker-0"]
    prom = Prometheus(tmp_path / "prometheus", {})
    try:
        assert prom.wait("vector(1)", lambda r: r is not None) is not None  # SIGHUP reloads now
        sd = {"files": [str(targets)], "refresh_interval": "1s"}
        (prom.dir / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                       "evaluation_interval": "1s"},
            "scrape_configs": [{"job_name": "dpstream", "file_sd_configs": [sd]}]}))
        prom.proc.send_signal(signal.SIGHUP)
        released = _published(d.config)
        prom.wait("up == 1", lambda r: r is not None and len(r) == len(groups))
        prom.wait("dpstream_released_step",
                  lambda r: bool(r) and all(float(x["value"][1]) == released for x in r))
        assert prom.by("up", "process") == {"releaser": 1.0, "worker-0": 1.0}
        assert prom.by("dpstream_released_step", "process") == {"releaser": float(released)}
    finally:
        prom.stop()


def test_version():
    from importlib.metadata import version

    proc = subprocess.run([sys.executable, "-m", "pipeline.cli", "--version"], capture_output=True,
                          text=True)
    assert proc.returncode == 0 and proc.stdout.strip() == f"dpstream {version('dpstream')}"


def test_waiting_for_the_workers_says_a_finished_count_once():
    """The intake wait polls every 0.2 s; when everything sent is handled but it waits on something
    else (reports lost with the broker's log), "handled 114 of 114" was printed on every poll."""
    from pipeline.cli.operator import _changes_only
    from pipeline.producer import progress_printer

    out = io.StringIO()
    label = "waiting for the workers: handled"
    show = _changes_only(progress_printer(label, " records sent before", every=0, stream=out))
    for done in (50, 50, 114, *[114] * 16):
        show(done, 114)
    assert out.getvalue().splitlines() == [
        "waiting for the workers: handled: 50 of 114 records sent before",
        "waiting for the workers: handled: 114 of 114 records sent before"]
