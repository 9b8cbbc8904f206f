"""One signed-looking request to the embedded object store, as the broker makes them (the store checks
the access key only)."""

from __future__ import annotations

import http.client

from pipeline.stream.local.embedded import OBJECT_STORE_BUCKET, EmbeddedObjectStore


def store_request(store: EmbeddedObjectStore, method: str, key: str, body: bytes = b"", path: str = "",
                  **headers):
    """(status, ETag, body) of ``method`` on ``key`` (``path``: a query or suffix after the key)."""
    conn = http.client.HTTPConnection("127.0.0.1", store.port, timeout=10)
    auth = f"AWS4-HMAC-SHA256 Credential={store.access_key}/20260101/us-east-1/s3/aws4_request"
    headers = {"Authorization": auth, **headers}
    conn.request(method, f"/{OBJECT_STORE_BUCKET}/{key}{path}", body=body, headers=headers)
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, resp.getheader("ETag"), data
