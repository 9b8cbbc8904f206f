"""JSON Schemas (draft 2020-12) of the public topics' keys and values, shipped with the package.

One file per topic and part: ``<topic>.key.json`` (the UTF-8 key as a JSON string) and
``<topic>.value.json`` (the JSON value), for the public topics ``releases``, ``synthetic`` and
``alerts`` (:data:`pipeline.stream.kafka.topics.PUBLIC_TOPICS`); and for producers, the value of the
``reports`` topic (``reports.value.json``: what is sent; the key is the user id). The fields are explained in
docs/topics.md. Validating needs a JSON Schema validator (e.g. the ``jsonschema`` package); this
module only finds and loads the files.
"""

from __future__ import annotations

import json
from importlib.resources import files
from typing import Any

from pipeline.stream.kafka.topics import PUBLIC_TOPICS

__all__ = ["SCHEMA_TOPICS", "PRODUCER_SCHEMAS", "PARTS", "schema_path", "load_schema"]

SCHEMA_TOPICS = PUBLIC_TOPICS  # every public topic has a key and a value schema
PRODUCER_SCHEMAS = (("reports", "value"),)  # what producers send (the key is the user id as UTF-8)
PARTS = ("key", "value")


def schema_path(topic: str, part: str):
    """The packaged schema file of ``topic``'s ``part`` (``"key"`` or ``"value"``)."""
    if (topic, part) in PRODUCER_SCHEMAS:
        return files(__name__) / f"{topic}.{part}.json"
    if topic not in SCHEMA_TOPICS:
        raise ValueError(f"topic must be one of the public topics {SCHEMA_TOPICS}, got {topic!r}")
    if part not in PARTS:
        raise ValueError(f"part must be one of {PARTS}, got {part!r}")
    return files(__name__) / f"{topic}.{part}.json"


def load_schema(topic: str, part: str) -> dict[str, Any]:
    """The schema of ``topic``'s ``part`` as a dict."""
    return json.loads(schema_path(topic, part).read_text(encoding="utf-8"))
