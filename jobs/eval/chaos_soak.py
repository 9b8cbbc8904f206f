"""Chaos soak: random kill -9 and SIGSTOP of every process of a `dpstream up` deployment, `up` included,
while steps are produced, closed and released; then a checker.

    python -m jobs.eval.chaos_soak [--n 2000] [--horizon 6] [--seed 0] [--fault-every 15]
                                   [--max-faults N] [--stall 240] [--dir DIR] [--json FILE]

A real `dpstream up` (durable embedded log, persistent embedded Redis under ``--dir``/home, two
workers) is driven through the command line as an operator would: per step, the simulated panel's
reports are sent with ``dpstream produce --jsonl`` (again until they are all with the workers:
:func:`all_taken`; a report sent twice is dead-lettered as a duplicate), ``dpstream close`` is repeated
until the step is closing, and the step must be released within ``--stall`` seconds. Meanwhile a
fault thread, every ``--fault-every`` seconds on average (exponential gaps, seeded), picks one of
the processes the endpoints file names — the broker, its object store, Redis, each worker, the
releaser — or `up` itself, and sends it SIGKILL, or SIGSTOP and SIGCONT 2-8 s later. A `up` that
is gone is started again (it stops what the killed one left, and goes on from the durable state).

The checker, once every step is released (then `dpstream down`):

* every acknowledged report counted once: the public synthetic panels equal the library's batch run
  over every report with the same derived seeds (a report lost, imputed or counted twice, or noise
  drawn again, changes them);
* one value per public key: every (topic, key) on ``releases``, ``synthetic`` and ``alerts`` holds
  byte-identical values, however often it was republished;
* the ledger holds exactly one entry per (release, spending step);
* no stall: each step released within ``--stall`` seconds of its first close attempt;
* no orphan: after `down`, no process of any `up` of the run (found by its supervisor tag) and no
  Redis it recorded is left.

Prints the figures (faults by target and kind, `up` restarts, step latencies) and exits 0 when every
check passed. ``tests/test_chaos_soak.py`` runs a short seeded version.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import yaml

K = 3
TARGETS = ("broker", "object-store", "redis", "releaser", "worker-0", "worker-1", "up")


def _config(directory: Path, name: str, n: int, horizon: int, seed: int) -> Path:
    cfg = {
        "name": name,
        "roster": {"size": n},
        "horizon": horizon,
        "topics": {"partitions": 2},
        "attributes": {"pov": {"type": "binary"}},
        "budget": {"rho": 0.5},
        "random": {"kind": "seeded", "seed": seed},
        "releases": [
            {"name": "fw", "type": "fixed_window", "attribute": "pov", "window": K, "share": 0.5},
            {"name": "cu", "type": "cumulative", "attribute": "pov", "share": 0.5},
        ],
    }
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def all_taken(produce: subprocess.CompletedProcess) -> bool:
    """Whether the workers hold every report of the file ``produce`` was given: it exited 0 (all
    accepted); or an earlier attempt got them there (acknowledged, then a fault before its verdict
    — its `up` killed, a worker stopped past the wait) and this one was refused because the workers
    hold every one (exit 3), or was sent and only duplicates were rejected (exit 5)."""
    if produce.returncode == 0:
        return True
    if produce.returncode == 3:
        return "already hold a report of for its step" in produce.stderr
    if produce.returncode == 5:
        return re.search(r"rejected \(duplicate [\d,]+\)\n", produce.stdout) is not None
    return False


class Soak:
    def __init__(
        self,
        directory: Path,
        n: int,
        horizon: int,
        seed: int,
        fault_every: float,
        stall: float,
        max_faults: int | None = None,
    ):
        self.dir, self.horizon, self.stall, self.fault_every = (
            directory,
            horizon,
            stall,
            fault_every,
        )
        self.max_faults = max_faults
        self.name = f"chaos-{seed}"
        self.path = _config(directory, self.name, n, horizon, seed)
        self.env = dict(os.environ, DPSTREAM_HOME=str(directory / "home"), PYTHONUNBUFFERED="1")
        self.env.pop("DPSTREAM_SUPERVISOR", None)
        self.rng = random.Random(seed)
        self.panel = np.random.default_rng(seed).integers(0, 2, size=(n, horizon))
        self.up: subprocess.Popen | None = None
        self.up_starts = 0
        self.tags: set[str] = set()
        self.redis_pids: set[int] = set()
        self.faults: Counter = Counter()
        self.latency: dict[int, float] = {}
        self.lock = threading.Lock()
        self.stop = threading.Event()

    # -- the deployment ------------------------------------------------------------------------
    def dpstream(self, *args, timeout: float = 120) -> subprocess.CompletedProcess:
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "pipeline.cli", *args, "--config", str(self.path)],
                capture_output=True,
                text=True,
                env=self.env,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as err:
            proc = subprocess.CompletedProcess(err.cmd, 124, "", "timed out")
        if args[0] != "status":  # what the operator saw, for the record
            with (self.dir / "driver.log").open("a") as fh:
                fh.write(
                    f"{time.strftime('%H:%M:%S')} dpstream {' '.join(args)} -> {proc.returncode}\n"
                    f"{proc.stdout[-500:]}{proc.stderr[-500:]}\n"
                )
        return proc

    def record(self) -> dict:
        try:
            rec = json.loads((self.dir / "home" / f"{self.name}.json").read_text())
        except (OSError, ValueError):
            return {}
        if rec.get("supervisor"):
            self.tags.add(rec["supervisor"])
        redis = (rec.get("processes") or {}).get("redis")
        if redis:
            self.redis_pids.add(redis["pid"])
        return rec

    def ensure_up(self) -> None:
        """Start `dpstream up` if none runs (first start, or after the fault thread killed it)."""
        with self.lock:
            if self.up is not None and self.up.poll() is None:
                return
            log = open(self.dir / "up.out", "ab")  # noqa: SIM115  (the child keeps it)
            self.up = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pipeline.cli",
                    "up",
                    "--config",
                    str(self.path),
                    "--workers",
                    "2",
                    "--log-dir",
                    str(self.dir / "logs"),
                ],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            log.close()
            self.up_starts += 1
        deadline = time.monotonic() + 60
        while "processes" not in self.record() and time.monotonic() < deadline:
            time.sleep(0.3)

    def status(self) -> dict | None:
        proc = self.dpstream("status", "--json", timeout=60)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    def pointers(self) -> tuple[int, int] | None:
        """(released, closing) read from Redis directly (a `status` command is slow on a loaded machine);
        None while Redis does not answer (killed, stopped, restarting)."""
        import redis

        from pipeline.stream.state.keys import Keys

        url = self.record().get("redis")
        if not url:
            return None
        keys, password = (
            Keys(self.name),
            (self.dir / "home" / self.name / "redis" / "password").read_text().strip(),
        )
        try:
            client = redis.Redis.from_url(
                url, password=password, socket_timeout=3, socket_connect_timeout=3
            )
            released, closing = client.mget(keys.pointer("released"), keys.pointer("closing"))
            client.close()
        except redis.RedisError:
            return None
        return int(released or 0), int(closing or 0)

    # -- faults --------------------------------------------------------------------------------
    def _fault_loop(self) -> None:
        while not self.stop.wait(self.rng.expovariate(1.0 / self.fault_every)):
            if self.max_faults is not None and sum(self.faults.values()) >= self.max_faults:
                return
            target, kind = self.rng.choice(TARGETS), self.rng.choice(("kill", "kill", "stop"))
            pause = self.rng.uniform(2.0, 8.0)
            with self.lock:
                pid = (
                    self.up.pid
                    if target == "up" and self.up
                    else ((self.record().get("processes") or {}).get(target) or {}).get("pid")
                )
                if not pid:
                    continue
                try:
                    os.kill(pid, signal.SIGKILL if kind == "kill" else signal.SIGSTOP)
                except ProcessLookupError:
                    continue
                self.faults[f"{kind} {target}"] += 1
            if kind == "stop":
                self.stop.wait(pause)
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass

    # -- driving the steps ---------------------------------------------------------------------
    def _report_file(self, step: int) -> Path:
        from pipeline.config import load_config
        from pipeline.stream.ingest.roster import Roster

        ids = Roster.from_config(load_config(self.path).roster).ids
        path = self.dir / f"step-{step}.jsonl"
        with path.open("w") as fh:
            for user, value in zip(ids, self.panel[:, step - 1].tolist()):
                fh.write(
                    json.dumps({"user": user, "step": step, "values": {"pov": int(value)}}) + "\n"
                )
        return path

    def run_step(self, step: int) -> None:
        reports = self._report_file(step)
        deadline = time.monotonic() + self.stall * 2
        while True:  # until every report is with the workers (all_taken)
            self.ensure_up()
            if all_taken(self.dpstream("produce", "--jsonl", str(reports))):
                break
            assert time.monotonic() < deadline, f"step {step}: produce never succeeded"
            time.sleep(1)
        started = time.monotonic()
        while True:
            self.ensure_up()
            pointers = self.pointers()
            if pointers and pointers[0] >= step:
                break
            if pointers and pointers[1] < step:
                self.dpstream("close", "--step", str(step), "--wait", "30", timeout=180)
            if time.monotonic() - started > self.stall:
                raise AssertionError(f"stall: step {step} not released within {self.stall:g} s")
            time.sleep(1)
        self.latency[step] = time.monotonic() - started

    # -- the checker ---------------------------------------------------------------------------
    def check_outputs(self) -> list[str]:
        from pipeline.config import load_config
        from pipeline.stream.local.broker_tls import BROKER_TLS_ENV

        record = self.record()
        deployment, broker = load_config(self.path), record["broker"]
        # the embedded broker's gate: the checker's clients need its files, for the check only (the
        # soak may run inside a test process, whose later tests must not inherit them)
        before = os.environ.get(BROKER_TLS_ENV)
        if record.get("broker_tls"):
            os.environ[BROKER_TLS_ENV] = record["broker_tls"]
        try:
            return self._check_outputs(deployment, broker)
        finally:
            if before is None:
                os.environ.pop(BROKER_TLS_ENV, None)
            else:
                os.environ[BROKER_TLS_ENV] = before

    def _check_outputs(self, deployment, broker: str) -> list[str]:
        from kafka import KafkaConsumer, TopicPartition

        from pipeline.connections import kafka_security
        from pipeline.consumer import read_topics
        from pipeline.stream.kafka.topics import PUBLIC_TOPICS, topic_names
        from pipeline.stream.releaser.engine import batch_reference

        problems: list[str] = []
        names = topic_names(deployment)
        consumer = KafkaConsumer(
            bootstrap_servers=broker,
            **kafka_security(),
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            consumer_timeout_ms=5000,
            max_partition_fetch_bytes=16 << 20,
        )
        tps = [TopicPartition(names[t], 0) for t in PUBLIC_TOPICS]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        values: dict[tuple[str, bytes], set[bytes]] = {}
        for msg in consumer:
            values.setdefault((msg.topic, msg.key), set()).add(msg.value)
        consumer.close()
        problems += [
            f"public key {key!r} of {topic} holds {len(v)} different values"
            for (topic, key), v in values.items()
            if len(v) > 1
        ]
        panels = read_topics(broker, names, timeout=60)
        reference = batch_reference(deployment, {"pov": self.panel})
        for rel in ("fw", "cu"):
            got = panels.panels[rel]
            if got.complete_steps != set(range(1, self.horizon + 1)):
                problems.append(f"{rel}: complete steps {sorted(got.complete_steps)}")
            elif not np.array_equal(got.as_array()[:, : self.horizon], reference[rel]):
                problems.append(
                    f"{rel}: the released panel differs from the batch run over every report"
                )
        ledger = sorted((self.status() or {}).get("ledger") or {})
        want = sorted(
            [f"fw:{t}" for t in range(K, self.horizon + 1)]
            + [f"cu:{t}" for t in range(1, self.horizon + 1)]
        )
        if ledger != want:
            problems.append(f"ledger {ledger} != one entry per release and step {want}")
        return problems

    def check_orphans(self) -> list[str]:
        from pipeline.stream.local.embedded import pid_alive
        from pipeline.stream.local.leftovers import tagged_processes

        deadline = time.monotonic() + 15
        while True:
            left = {pid: cmd for tag in self.tags for pid, cmd in tagged_processes(tag).items()}
            left.update(
                {
                    pid: "redis-server"
                    for pid in self.redis_pids
                    if pid_alive(pid)
                    and b"redis-server" in Path(f"/proc/{pid}/cmdline").read_bytes()
                }
            )
            if not left or time.monotonic() > deadline:
                return [f"orphan process {pid}: {cmd[:100]}" for pid, cmd in left.items()]
            time.sleep(0.5)

    def run(self) -> dict:
        self.ensure_up()
        faults = threading.Thread(target=self._fault_loop, daemon=True)
        faults.start()
        problems = []
        try:
            for step in range(1, self.horizon + 1):
                self.run_step(step)
        except AssertionError as err:
            problems.append(str(err))
        finally:
            self.stop.set()
            faults.join(timeout=15)
        if not problems:
            self.ensure_up()
            try:
                problems += self.check_outputs()
            except Exception as err:  # a failed check still stops everything below
                problems.append(f"the checker failed: {type(err).__name__}: {err}")
        self.record()
        down = self.dpstream("down", timeout=120)
        if down.returncode != 0:
            problems.append(f"down exited {down.returncode}: {down.stderr.strip()[-300:]}")
        if self.up is not None:
            try:
                self.up.wait(timeout=30)
            except subprocess.TimeoutExpired:
                problems.append("up did not stop")
        problems += self.check_orphans()
        return {
            "steps": self.horizon,
            "faults": dict(sorted(self.faults.items())),
            "fault_total": sum(self.faults.values()),
            "up_starts": self.up_starts,
            "release_seconds": {t: round(s, 1) for t, s in self.latency.items()},
            "problems": problems,
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--horizon", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--fault-every", type=float, default=15.0, help="mean seconds between faults")
    ap.add_argument("--max-faults", type=int, default=None, help="stop injecting after this many")
    ap.add_argument(
        "--stall", type=float, default=240.0, help="seconds a step may take to be released"
    )
    ap.add_argument("--dir", default=None, help="working directory (default: a new temporary one)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    directory = Path(args.dir or tempfile.mkdtemp(prefix="dpstream-chaos-"))
    directory.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    result = Soak(
        directory, args.n, args.horizon, args.seed, args.fault_every, args.stall, args.max_faults
    ).run()
    result["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(result, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0 if not result["problems"] else 1


if __name__ == "__main__":
    sys.exit(main())
