"""The object store's HTTP front (pipeline/stream/local/store_server.py): the broker's requests
answered on a kept-alive connection, and the requests it hands to the full handler answered
consistently with its own (real object-store process, plain HTTP clients)."""

from __future__ import annotations

import http.client
import re

from pipeline.stream.local.embedded import OBJECT_STORE_BUCKET, EmbeddedObjectStore


def _auth(store: EmbeddedObjectStore) -> dict[str, str]:
    credential = f"{store.access_key}/20260101/us-east-1/s3/aws4_request"
    return {"Authorization": f"AWS4-HMAC-SHA256 Credential={credential}"}


def _call(conn, store, method, key, body=b"", path="", **headers):
    conn.request(
        method,
        f"/{OBJECT_STORE_BUCKET}/{key}{path}",
        body=body,
        headers={**_auth(store), **headers},
    )
    resp = conn.getresponse()
    return resp, resp.read()


def test_a_failed_condition_or_a_missing_key_keeps_the_connection_open(tmp_path):
    """The broker's compare-and-swap of a watermark loses races (412) and its reads find no object
    yet (404): the server used to close the connection after every error answer, so each one cost
    the broker a new connection; S3 keeps it open."""
    store = EmbeddedObjectStore(tmp_path / "objects").start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", store.port, timeout=10)
        resp, _ = _call(conn, store, "PUT", "p/watermark.json", b"1", **{"If-None-Match": "*"})
        assert resp.status == 200
        first_socket = conn.sock
        for method, key, headers, status in (
            ("PUT", "p/watermark.json", {"If-Match": '"stale"'}, 412),
            ("PUT", "p/watermark.json", {"If-None-Match": "*"}, 412),
            ("GET", "p/absent.json", {}, 404),
            ("HEAD", "p/absent.json", {}, 404),
            ("GET", "p/watermark.json", {}, 200),
        ):
            resp, body = _call(conn, store, method, key, **headers)
            assert resp.status == status, (method, key, headers)
            assert not resp.will_close, (method, key, status)
            if status >= 400 and method != "HEAD":
                assert b"<Error>" in body
        assert body == b"1" and conn.sock is first_socket  # every answer on the first connection
        conn.close()
    finally:
        store.stop()


def test_requests_off_the_fast_path_see_the_same_objects_and_etags(tmp_path):
    """Ranges, ListObjects v1 and copies go to the full handler; chunked bodies, reads, listings v2
    and deletes are answered by the front: each sees what the other wrote, with one ETag per
    body."""
    store = EmbeddedObjectStore(tmp_path / "objects").start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", store.port, timeout=10)
        body = bytes(range(256)) * 40
        conn.request(
            "PUT",
            f"/{OBJECT_STORE_BUCKET}/r/a.batch",
            body=iter([body[:5000], body[5000:]]),
            headers={**_auth(store), "If-None-Match": "*"},
            encode_chunked=True,
        )
        resp = conn.getresponse()
        resp.read()
        assert resp.status == 200
        etag = resp.getheader("ETag")

        resp, got = _call(conn, store, "GET", "r/a.batch", Range="bytes=10-19")  # full handler
        assert resp.status == 206 and got == body[10:20] and resp.getheader("ETag") == etag
        resp, got = _call(conn, store, "GET", "r/a.batch")  # front
        assert resp.status == 200 and got == body and resp.getheader("ETag") == etag
        resp, _ = _call(conn, store, "HEAD", "r/a.batch")
        assert resp.getheader("Content-Length") == str(len(body)) and resp.getheader("ETag") == etag

        # a copy (full handler) is found by the front's reads and listings, with its ETag
        resp, _ = _call(
            conn,
            store,
            "PUT",
            "r/b.batch",
            **{"x-amz-copy-source": f"/{OBJECT_STORE_BUCKET}/r/a.batch"},
        )
        assert resp.status == 200
        resp, got = _call(conn, store, "GET", "r/b.batch")
        assert got == body and resp.getheader("ETag") == etag

        _, v2 = _call(conn, store, "GET", "", path="?list-type=2&prefix=r/")
        _, v1 = _call(conn, store, "GET", "", path="?prefix=r/")
        for listing in (v2, v1):
            text = listing.decode()
            assert re.findall(r"<Key>([^<]+)</Key>", text) == ["r/a.batch", "r/b.batch"]
            assert re.findall(r"<ETag>(?:&quot;|\")([0-9a-f]+)", text) == [etag.strip('"')] * 2

        resp, _ = _call(conn, store, "DELETE", "r/a.batch")
        assert resp.status == 204
        resp, _ = _call(conn, store, "GET", "r/a.batch", Range="bytes=0-1")
        assert resp.status == 404
        _, v1 = _call(conn, store, "GET", "", path="?prefix=r/")
        assert re.findall(r"<Key>([^<]+)</Key>", v1.decode()) == ["r/b.batch"]

        # the access key is checked on every request, whichever path would answer it
        for target in ("/r/b.batch", "?list-type=2", "?prefix=r/", "/r/b.batch?tagging"):
            conn.request(
                "GET",
                f"/{OBJECT_STORE_BUCKET}{target}",
                headers={"Authorization": "AWS4-HMAC-SHA256 Credential=other/x"},
            )
            resp = conn.getresponse()
            resp.read()
            assert resp.status == 403
        conn.close()
    finally:
        store.stop()
