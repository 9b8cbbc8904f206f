"""Follow a dpstream deployment's heavy-hitter and band alerts live with a faust-streaming agent.

A downstream consumer of the public topics as they are (docs/topics.md): one agent reads
``<prefix>.<deployment>.alerts`` from its start and keeps following it, one reads the deployment
descriptor (``<prefix>.<deployment>.deployment``) for each release's k. Alerts are keyed
``<release>:<step>``; a releaser that restarts republishes a step with the same key and bytes, so
the agent keeps one alert per key. Each alert is printed in one line and, with
``DPSTREAM_ALERTS_OUT``, appended to a JSON Lines file.

    DPSTREAM_ALERTS_BOOTSTRAP=localhost:9092 DPSTREAM_ALERTS_DEPLOYMENT=sipp-poverty \\
        python docs/examples/alerts_faust_agent.py worker -l warn

Optional: ``DPSTREAM_ALERTS_TLS_DIR``, a directory with ``ca.pem``, ``client.pem`` and ``client.key``
for a broker that asks for a client certificate (the embedded broker's gate: the directory
``dpstream up`` records as ``broker_tls`` in ``$DPSTREAM_HOME/<deployment>.json``);
``DPSTREAM_ALERTS_PREFIX`` (the deployment's ``topics.prefix``, default ``dpstream``),
``DPSTREAM_ALERTS_DATADIR`` (faust's data directory, default ``./faust-alerts-data``). The consumer
group is ``dpstream-<deployment>-downstream-faust-alerts`` (the prefix the analysts' broker grant
allows, docs/security.md).

Reading a noisy count: with the ``tct``/``tme`` methods each flag charges every user holding the
value, and a user charged k times no longer counts. A value's noisy count after its holders' flags
ran out counts only the users with flags left: a falling count then is not a falling popularity.
Needs faust-streaming (the project's ``test`` extra).
"""

from __future__ import annotations

import json
import os
import ssl

import faust

BOOTSTRAP = os.environ["DPSTREAM_ALERTS_BOOTSTRAP"]
DEPLOYMENT = os.environ["DPSTREAM_ALERTS_DEPLOYMENT"]
PREFIX = os.environ.get("DPSTREAM_ALERTS_PREFIX", "dpstream")
OUT = os.environ.get("DPSTREAM_ALERTS_OUT")
TLS_DIR = os.environ.get("DPSTREAM_ALERTS_TLS_DIR")


def _credentials() -> faust.SSLCredentials | None:
    """Mutual TLS with the files in ``TLS_DIR``, when set."""
    if not TLS_DIR:
        return None
    context = ssl.create_default_context(cafile=os.path.join(TLS_DIR, "ca.pem"))
    context.load_cert_chain(os.path.join(TLS_DIR, "client.pem"), os.path.join(TLS_DIR, "client.key"))
    return faust.SSLCredentials(context)


# The embedded broker (Tansu) holds a JoinGroup for half the session timeout: faust's default of
# 60 s made the agent wait 30 s at every start and rebalance; 10 s (Kafka's default before 3.0)
# joins in about 5 s and still outlasts the heartbeats (every 3 s).
app = faust.App(f"dpstream-{DEPLOYMENT}-downstream-faust-alerts", broker=f"kafka://{BOOTSTRAP}",
                web_enabled=False, consumer_auto_offset_reset="earliest", topic_partitions=1,
                broker_session_timeout=10.0, broker_credentials=_credentials(),
                datadir=os.environ.get("DPSTREAM_ALERTS_DATADIR", "faust-alerts-data"))
alerts_topic = app.topic(f"{PREFIX}.{DEPLOYMENT}.alerts", key_serializer="raw",
                         value_serializer="raw")
descriptor_topic = app.topic(f"{PREFIX}.{DEPLOYMENT}.deployment", key_serializer="raw",
                             value_serializer="raw")

seen: set[str] = set()  # alert keys already shown (a republished alert repeats its key and bytes)
flags: dict[tuple[str, int], int] = {}  # (release, id) -> times flagged so far
k_of: dict[str, int] = {}  # release -> k, from the descriptor


def describe(alert: dict) -> str:
    """The flagged ids with their labels, noisy counts and flag numbers; or the band answer."""
    if alert["type"] != "heavy_hitters":
        return f"{alert['value']!r} is {alert['answer']} ({alert['low']}, {alert['high']})"
    counts = alert.get("noisy_counts") or [None] * len(alert["flagged"])
    parts = []
    for item, count in zip(alert["flagged"], counts):
        flags[(alert["release"], item)] = times = flags.get((alert["release"], item), 0) + 1
        name = alert["labels"].get(str(item), f"code {item}")
        k = k_of.get(alert["release"])
        text = name + ("" if count is None else f" (noisy count {count:,})") + f", flag {times}"
        parts.append(text + (f" of k = {k}" if k else ""))
    return "flagged: " + ("; ".join(parts) or "nothing")


@app.agent(descriptor_topic)
async def descriptors(stream):
    async for value in stream:
        config = json.loads(value)["config"]
        k_of.update({r["name"]: r["k"] for r in config["releases"] if r["type"] == "heavy_hitters"})


@app.agent(alerts_topic)
async def follow(stream):
    async for event in stream.events():
        key = event.key.decode()
        if key in seen:
            continue
        seen.add(key)
        alert = json.loads(event.value)
        line = f"step {alert['step']} {alert['release']}: {describe(alert)}"
        print(line, flush=True)
        if OUT:
            with open(OUT, "a", encoding="utf-8") as fh:
                fh.write(json.dumps({"key": key, "line": line, "alert": alert}) + "\n")


if __name__ == "__main__":
    app.main()
