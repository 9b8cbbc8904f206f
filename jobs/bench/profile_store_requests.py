"""The embedded object store's own CPU per request, for the broker's produce sequence.

    python -m jobs.bench.profile_store_requests [--produces 500] [--batch-bytes 3000]
        [--json out/profile_store_requests.json]

Starts the object store (:mod:`pipeline.stream.local.object_store`, in its default journal mode)
and, on one kept-alive connection as the broker keeps them, repeats what the broker sends for one
produce to one partition: ``GET`` of the watermark, ``PUT`` of the watermark with ``If-Match`` (its
compare-and-swap), ``PUT`` of a record batch with ``If-None-Match: *``; every 50th produce also a
compare-and-swap that loses (``412``); then 20 ListObjectsV2 pages of the batches (timed apart, as
the client sees them: what a fetch asks first). The store process's user and system CPU time
(``/proc/<pid>/stat``) over the produces' requests, divided by their number, is its CPU per request;
the wall time per request is the client's view (it includes the journal's flushes, ``fdatasync``,
whose waiting is not CPU). Run it from another checkout to compare versions: the store process is
started from the current directory's ``pipeline`` package.
"""

from __future__ import annotations

import argparse
import http.client
import os
import tempfile
import time
from pathlib import Path

from jobs.bench import write_json

_WATERMARK = "clusters/c/topics/t/partitions/0000000000/watermark.json"
_LISTINGS = 20
_BATCH = "clusters/c/topics/t/partitions/0000000000/records/{:020d}.batch"


def _cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


class _Client:
    """One connection as the broker's keeps it; reconnects when the server closes it."""

    def __init__(self, port: int, access_key: str):
        self.port, self.reconnects = port, 0
        credential = f"{access_key}/20260101/us-east-1/s3/aws4_request"
        self.auth = {"Authorization": f"AWS4-HMAC-SHA256 Credential={credential}"}
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def __call__(self, method: str, target: str, body: bytes = b"", **headers) -> tuple[int, str]:
        from pipeline.stream.local.embedded import OBJECT_STORE_BUCKET

        self.conn.request(
            method, f"/{OBJECT_STORE_BUCKET}/{target}", body=body, headers={**self.auth, **headers}
        )
        resp = self.conn.getresponse()
        resp.read()
        if resp.will_close:
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
            self.reconnects += 1
        return resp.status, resp.getheader("ETag") or ""


def run(produces: int, batch_bytes: int) -> dict:
    from pipeline.stream.local.embedded import EmbeddedObjectStore

    with tempfile.TemporaryDirectory(prefix="profile-store-") as tmp:
        store = EmbeddedObjectStore(Path(tmp) / "objects").start()
        try:
            assert store._proc is not None
            client = _Client(store.port, store.access_key)
            status, etag = client("PUT", _WATERMARK, b'{"high":0}')
            assert status == 200, status
            batch = os.urandom(batch_bytes)
            requests = 0
            user0, system0 = _cpu_seconds(store._proc.pid)
            started = time.monotonic()
            for i in range(produces):
                client("GET", _WATERMARK)
                status, etag = client("PUT", _WATERMARK, b'{"high":%d}' % i, **{"If-Match": etag})
                assert status == 200, status
                status, _ = client("PUT", _BATCH.format(i), batch, **{"If-None-Match": "*"})
                assert status == 200, status
                requests += 3
                if i % 50 == 0:
                    assert client("PUT", _WATERMARK, b"x", **{"If-Match": '"stale"'})[0] == 412
                    requests += 1
            wall = time.monotonic() - started
            user1, system1 = _cpu_seconds(store._proc.pid)
            prefix = _BATCH.rsplit("/", 1)[0] + "/"
            listed = time.monotonic()
            for _ in range(_LISTINGS):  # what a fetch asks first: a page of the partition's batches
                assert client("GET", f"?list-type=2&prefix={prefix}")[0] == 200
            listing = (time.monotonic() - listed) / _LISTINGS
        finally:
            store.stop()
    return {
        "requests": requests,
        "batch_bytes": batch_bytes,
        "cpu_ms_per_request": 1e3 * (user1 - user0 + system1 - system0) / requests,
        "user_ms_per_request": 1e3 * (user1 - user0) / requests,
        "system_ms_per_request": 1e3 * (system1 - system0) / requests,
        "wall_ms_per_request": 1e3 * wall / requests,
        "listing_page_keys": min(produces, 1000),
        "listing_page_ms": 1e3 * listing,
        "reconnects": client.reconnects,
        "load_average": os.getloadavg(),
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--produces", type=int, default=500)
    ap.add_argument("--batch-bytes", type=int, default=3000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    result = run(args.produces, args.batch_bytes)
    r = result
    print(
        f"{r['requests']} requests: store CPU {r['cpu_ms_per_request']:.3f} ms a request "
        f"(user {r['user_ms_per_request']:.3f}, system {r['system_ms_per_request']:.3f}); "
        f"wall {r['wall_ms_per_request']:.3f} ms; {r['reconnects']} reconnects; "
        f"a listing page of {r['listing_page_keys']} keys {r['listing_page_ms']:.1f} ms; "
        f"load average {r['load_average'][0]:.1f}"
    )
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
