"""The topics a broker has, listed by an admin client (a request for all topics: none created)."""

from __future__ import annotations

from kafka import KafkaAdminClient


def listed_topics(bootstrap: str) -> set[str]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        return set(admin.list_topics())
    finally:
        admin.close()
