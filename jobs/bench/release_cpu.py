"""A step's close and release, part by part, in CPU seconds of one process (no broker, no Redis).

    python -m jobs.bench.release_cpu [--n 1000000] [--steps 4] [--json out/release_cpu.json]

The stream benchmark (:mod:`jobs.bench.bench_stream`) splits a step's latency by the jobs' log lines
(wall clock, moving with the machine's load); this job measures what each part of that path costs
itself, with ``time.process_time``, for iterating on it. The benchmark's deployment (a fixed window
k = 3, a cumulative T = 12 and a tct heavy-hitter release, 4 partitions) is driven in process: an
:class:`IngestCore` owning every partition is fed each step as columnar batches, closes it (per
partition: the partial and the checkpoint), and a :class:`ReleaseEngine` releases it — the partials
decoded, the mechanisms, the step record (outputs and stored engine state) encoded for Redis, the
public messages encoded, and a reader (:class:`pipeline.consumer.PanelStore`) decoding and checking
them. Heavy-hitter feedback is applied before the next close, as the workers do.
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import numpy as np
import orjson

from jobs.bench import write_json

PARTS = (
    "close_ms_per_partition",
    "checkpoint_mb_per_partition",
    "partials_decode_ms",
    "mechanisms_ms",
    "record_encode_ms",
    "record_mb",
    "publish_encode_ms",
    "public_mb",
    "reader_ms",
)


def run(n: int, steps: int) -> list[dict]:
    from jobs.bench.bench_stream import DOMAIN, HORIZON, _config
    from pipeline.config import parse_config
    from pipeline.consumer import PanelStore
    from pipeline.serialization import dumps_state
    from pipeline.stream.ingest.core import IngestCore, Record
    from pipeline.stream.ingest.roster import Roster
    from pipeline.stream.kafka.messages import PartialAssembler, synthetic_chunks
    from pipeline.stream.kafka.topics import topic_names
    from pipeline.stream.releaser.engine import ReleaseEngine, stored_state

    P = 4
    nowhere = SimpleNamespace(
        broker=SimpleNamespace(bootstrap="unused:0"), redis=SimpleNamespace(url="unused")
    )
    deployment = parse_config(_config(n, P, nowhere))  # the stream benchmark's deployment
    roster = Roster.from_config(deployment.roster)
    core = IngestCore(deployment, roster, topic_names(deployment), isolated=True)
    rng = np.random.default_rng(0)  # the stream benchmark's panel
    pov = (rng.random((n, HORIZON)) < 0.12).astype(np.int8)
    item = rng.integers(0, DOMAIN, size=(n, HORIZON)).astype(np.int32)
    item[: n // 50] = 12345
    owners = roster.owners(P)
    rows = {p: np.flatnonzero(owners == p) for p in range(P)}
    offsets = {p: 0 for p in range(P)}
    for p in range(P):
        core.assign(p)
    engine, out = ReleaseEngine(deployment, n), []
    for t in range(1, steps + 1):
        row: dict = {"step": t}
        messages, close_s, checkpoint_b = [], 0.0, 0
        for p in range(P):
            batches = []
            for j in range(0, rows[p].size, 5000):
                r = rows[p][j : j + 5000]
                batches.append(
                    Record(
                        offsets[p],
                        orjson.dumps(
                            {
                                "columns": {
                                    "user": [roster.ids[i] for i in r.tolist()],
                                    "step": t,
                                    "poverty": pov[r, t - 1].tolist(),
                                    "item": item[r, t - 1].tolist(),
                                }
                            }
                        ),
                    )
                )
                offsets[p] += 1
            core.enqueue(p, batches)
            core.drain_all(p)
            started = time.process_time()
            msgs, blob, _ = core.close(p, t, offsets[p], 1_800_000_000_000 + 1000 * t)
            close_s += time.process_time() - started
            offsets[p] += 1
            checkpoint_b += len(blob)
            messages += msgs
        row["close_ms_per_partition"] = close_s / P * 1e3
        row["checkpoint_mb_per_partition"] = checkpoint_b / P / 1e6

        clock = time.process_time()

        def lap() -> float:
            nonlocal clock
            now, was = time.process_time(), clock
            clock = now
            return (now - was) * 1e3

        assembler = PartialAssembler(P)
        for _, value in messages:
            assembler.add(value)
        partials = assembler.pop(t)
        row["partials_decode_ms"] = lap()
        outputs = engine.release(t, partials)
        row["mechanisms_ms"] = lap()
        record = [o.to_bytes() for o in outputs] + [dumps_state(stored_state(engine.get_state()))]
        row["record_encode_ms"], row["record_mb"] = lap(), sum(map(len, record)) / 1e6
        public = []
        for o in outputs:
            public.append(("releases", orjson.dumps(o.manifest, option=orjson.OPT_SORT_KEYS)))
            if o.columns is not None:
                public += [
                    ("synthetic", v)
                    for _, v in synthetic_chunks(o.release, t, o.column_steps, o.columns)
                ]
        row["publish_encode_ms"], row["public_mb"] = lap(), sum(len(v) for _, v in public) / 1e6
        store = PanelStore()
        for topic, value in public:
            (store.add_manifest if topic == "releases" else store.add_chunk)(value)
        row["reader_ms"] = lap()
        for o in outputs:  # the workers apply the step's heavy-hitter flags before the next close
            if o.feedback is not None:
                body = orjson.dumps({"release": o.release, "step": t, **o.feedback})
                for p in range(P):
                    core.apply_feedback(p, body)
        out.append(row)
        print(f"step {t}: " + ", ".join(f"{k} {row[k]:.1f}" for k in PARTS), flush=True)
    return out


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    rows = run(args.n, args.steps)
    write_json(args.json, {"n": args.n, "steps": rows})
    return rows


if __name__ == "__main__":
    main()
