"""`dpstream produce` with real data on real processes (`dpstream up`: embedded broker, Redis, a
worker and the releaser): the simulator only when asked and never on a production deployment;
the workers' verdict on the reports sent, by reason, with exit code 5 when any was rejected; a dry
run that knows what the workers already hold; Ctrl-C as one line and exit 130."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import yaml

from jobs.eval.chaos_soak import all_taken
from pipeline.connections import kafka_security
from support.cli import N, deployment, dpstream, running  # noqa: F401 - `deployment` is a fixture


def _csv(path, step: int, users=range(N)) -> str:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["user", "step", "poverty"])
        w.writerows([f"u{i}", step, i % 2] for i in users)
    return str(path)


def _stream_pids(tmp_path) -> dict[str, int]:
    record = json.loads((tmp_path / "home" / "cli-test.json").read_text())
    return {name: p["pid"] for name, p in record["processes"].items()}


def _production(path, tmp_path):
    cfg = yaml.safe_load(path.read_text())
    prod = tmp_path / "prod.yaml"
    prod.write_text(yaml.safe_dump(dict(cfg, production=True, random={"kind": "secure"})))
    return prod


def test_the_simulator_runs_only_when_asked_and_never_in_production(deployment, tmp_path):
    """Before: `produce --config prod.yaml` (production: true, no file) sent n simulated reports,
    exit 0, and the curator's real file sent next was dead-lettered as duplicate."""
    path, env = deployment
    prod = _production(path, tmp_path)
    cfg = ["--config", str(prod)]
    with running(prod, env, tmp_path):
        proc = dpstream("produce", *cfg, env=env, check=False)
        assert proc.returncode == 2, proc.stdout
        assert "--csv, --jsonl or --parquet FILE" in proc.stderr and "--simulate" in proc.stderr
        proc = dpstream("produce", *cfg, "--simulate", env=env, check=False)
        assert proc.returncode == 2 and "--simulate is refused" in proc.stderr
        assert "production: true" in proc.stderr
        status = json.loads(dpstream("status", *cfg, "--json", env=env).stdout)["intake"]
        assert status["open"].get("1", {"reported": 0})["reported"] == 0  # nothing was sent
        # the real file goes through, every report accepted
        out = dpstream("produce", *cfg, "--csv", _csv(tmp_path / "s1.csv", 1), env=env).stdout
        assert f"{N:,} accepted, 0 rejected" in out, out


def test_produce_reports_what_the_workers_rejected(deployment, tmp_path):
    """Sending a month twice: before, "all acknowledged" and exit 0 while the workers dead-lettered
    all of it as duplicate, and --dry-run passed. Now the dry run says so (exit 5), and the send is
    refused with nothing sent (exit 3: every report would be a duplicate, counted from the reports
    log as the dry run counts); a file only part of which the workers hold is sent, with the exact
    count said first, and the workers' verdict is printed by reason with exit 5."""
    path, env = deployment
    cfg = ["--config", str(path)]
    step1 = _csv(tmp_path / "s1.csv", 1)
    with running(path, env, tmp_path):
        first = dpstream("produce", *cfg, "--csv", step1, env=env)
        verdict = f"workers' verdict on the {N} reports sent: {N} accepted, 0 rejected"
        assert verdict in first.stdout, first.stdout
        dry1 = dpstream("produce", *cfg, "--csv", step1, "--dry-run", env=env, check=False)
        assert dry1.returncode == 5, (dry1.stdout, dry1.stderr)
        assert f"step 1: {N} of the {N} reports are of users the workers already hold" in \
            dry1.stdout, dry1.stdout
        letters = dpstream("dead-letters", *cfg, "--json", env=env).stdout
        again = dpstream("produce", *cfg, "--csv", step1, env=env, check=False)
        assert again.returncode == 3, (again.stdout, again.stderr)
        assert f"nothing sent: every one of the {N} reports is of a user the workers already " \
            "hold a report of for its step" in again.stderr, again.stderr
        assert again.stdout == ""  # no "sent" line
        assert dpstream("dead-letters", *cfg, "--json", env=env).stdout == letters
        # half of step 2 then the other half: the second dry run finds no duplicate
        dpstream("produce", *cfg, "--csv", _csv(tmp_path / "a.csv", 2, range(N // 2)), env=env)
        second_half = _csv(tmp_path / "b.csv", 2, range(N // 2, N))
        dry = dpstream("produce", *cfg, "--csv", second_half, "--dry-run", env=env)
        assert "pass the workers' checks, none a duplicate" in dry.stdout, dry.stdout
        # the whole of step 2 then: sent, and the half the workers hold is rejected
        whole = dpstream("produce", *cfg, "--csv", _csv(tmp_path / "w.csv", 2), env=env,
                         check=False)
        assert whole.returncode == 5, (whole.stdout, whole.stderr)
        assert f"WARNING: step 2: {N // 2} of the {N} reports are of users the workers already " \
            "hold a report of" in whole.stderr, whole.stderr
        assert f"{N - N // 2} accepted, {N // 2} rejected (duplicate {N // 2})" in whole.stdout
        assert "dpstream dead-letters" in whole.stderr
        # the chaos soak's retry reads these as "every report is with the workers"
        assert all_taken(first) and all_taken(again) and all_taken(whole)
        assert not all_taken(dry1)  # a dry run sends nothing (exit 5: would be rejected)
        # the simulator, asked for, is judged the same way; --no-wait does not wait
        sim = dpstream("produce", *cfg, "--simulate", "--step", "3", env=env)
        assert f"sent {N} simulated reports for step 3" in sim.stdout
        assert f"{N} accepted, 0 rejected" in sim.stdout
        nowait = dpstream("produce", *cfg, "--csv", second_half, "--replace", "--no-wait", env=env)
        assert "not waiting for the workers' verdict" in nowait.stdout
        assert "accepted" not in nowait.stdout


def test_late_reports_and_batch_rows_are_judged_per_report(deployment, tmp_path, capsys,
                                                           monkeypatch):
    """A step that a close overtakes mid-send: the close markers precede the reports on the log, the
    workers dead-letter them as late, and the verdict says so (before: "all acknowledged", exit 0).
    Batch messages (as a columnar upload sends them) are judged per report, whatever partition they
    went to: a rejected row counts once, a batch rejected whole counts all its rows, and another
    producer's rejected message is not counted."""
    from kafka import KafkaProducer

    from pipeline.cli.verdict import report_fates
    from pipeline.config import load_config
    from pipeline.fates import Receipt, dead_letter_mark
    from pipeline.producer import ReportSender
    from pipeline.stream.ingest.roster import Roster
    from pipeline.stream.kafka.report_producer import ReportProducer
    from pipeline.stream.kafka.topics import topic_names

    path, env = deployment
    monkeypatch.setenv("DPSTREAM_HOME", env["DPSTREAM_HOME"])  # report_fates finds the running `up`
    with running(path, env, tmp_path) as broker:
        workers = [pid for name, pid in _stream_pids(tmp_path).items() if name.startswith("worker")]
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)  # the workers fall behind the close
        try:
            dep = load_config(path)
            closer = ReportProducer(broker, dep, Roster.from_config(dep.roster), topic_names(dep))
            closer.close_step(1)
            closer.close()
            deadline = time.monotonic() + 60
            status = ("status", "--config", str(path), "--json", "--wait", "0")
            # until the releaser has written the close markers
            while json.loads(dpstream(*status, env=env).stdout)["closing_step"] < 1:
                assert time.monotonic() < deadline
                time.sleep(0.3)
            mark = dead_letter_mark(broker, "dpstream.cli-test.dead-letter", 1)
            reports = [{"user": f"u{i}", "step": 1, "values": {"poverty": i % 2}}
                       for i in range(N)]
            with ReportSender(dep, broker) as sender:
                result = sender.send(reports)
            assert result.acknowledged == N
        finally:
            for pid in workers:
                os.kill(pid, signal.SIGCONT)
        assert report_fates(dep, result.receipt, mark, timeout=60) == 5
        assert f"0 accepted, {N} rejected (late {N})" in capsys.readouterr().out

        names = topic_names(dep)
        mark = dead_letter_mark(broker, names["dead-letter"], 1)
        receipt = Receipt(names["reports"])
        rows = {"columns": {"user": ["u1", "u2", "nobody", "u3"], "step": 2,
                            "poverty": [1, 0, 1, 7]}}
        ragged = {"columns": {"user": ["u4", "u5"], "step": 2, "poverty": [1]}}  # rejected whole
        producer = KafkaProducer(bootstrap_servers=broker, **kafka_security())  # no key: any partition
        for batch, size in ((rows, 4), (ragged, 2)):
            stored = producer.send(names["reports"], json.dumps(batch).encode()).get(timeout=30)
            receipt.add(stored.partition, stored.offset, size)
        producer.send(names["reports"], b"{not json").get(timeout=30)  # another producer's
        producer.close()
        assert report_fates(dep, receipt, mark, timeout=60) == 5
        out = capsys.readouterr().out
        expected = ("6 reports sent: 2 accepted, 4 rejected (malformed 2, out_of_domain 1, "
                    "unknown_user 1)")
        assert expected in out, out


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_is_one_line_and_exit_130(deployment, tmp_path):
    """Before: a KeyboardInterrupt traceback (and, just after the send, "all acknowledged" with exit
    130). Interrupted while waiting for the verdict, then before sending: one line, exit 130."""
    path, env = deployment

    def produce(csv_file: str, wait: str) -> subprocess.Popen:
        command = [sys.executable, "-m", "pipeline.cli", "produce", "--config", str(path),
                   "--csv", csv_file, "--wait", wait]
        # Ctrl-C's default in the child even where the suite runs as a background job, whose
        # children inherit an ignored SIGINT (Python then installs no KeyboardInterrupt handler)
        return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, preexec_fn=_default_sigint)

    def interrupted(proc, err_before: str = "") -> tuple[str, str]:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        err = err_before + err
        assert proc.returncode == 130, (out, err)
        ours = [line for line in err.splitlines() if line.startswith("dpstream:")]
        assert len(ours) == 1, err
        assert ours[0].startswith("dpstream: interrupted (Ctrl-C) while"), err
        assert "Traceback" not in err and "KeyboardInterrupt" not in err
        return out, ours[0]

    with running(path, env, tmp_path):
        workers = [pid for name, pid in _stream_pids(tmp_path).items() if name.startswith("worker")]
        for pid in workers:
            os.kill(pid, signal.SIGSTOP)  # produce waits for a verdict that does not come
        try:
            proc = produce(_csv(tmp_path / "s1.csv", 1), "0")
            first = proc.stdout.readline()  # acknowledged: it now waits for the verdict (its stage
            assert f"sent {N} reports for step 1" in first, first  # is named before this line)
            out, line = interrupted(proc)
            assert "while waiting for the workers' verdict" in line and "accepted" not in out
            # step 1's reports are not handled: the next produce waits for the workers' counts
            proc = produce(_csv(tmp_path / "s2.csv", 2), "60")
            err = proc.stderr.readline()
            assert "waiting for the workers: handled" in err, err
            out, line = interrupted(proc, err)
            assert "while waiting for the workers' counts" in line and out == ""  # nothing sent
        finally:
            for pid in workers:
                os.kill(pid, signal.SIGCONT)


def _heavy_hitter_config(path, tmp_path):
    """The test deployment with the live heavy-hitter example's attributes: no binary attribute."""
    cfg = yaml.safe_load(path.read_text())
    employment = {"type": "categorical", "values": ["employed", "unemployed", "inactive"]}
    cfg.update(attributes={"item": {"type": "hashed", "size": 1 << 20}, "employment": employment},
               budget={"epsilon": 4.0, "delta": 1e-6},
               releases=[{"name": "hh", "type": "heavy_hitters", "attribute": "item",
                          "method": "tct", "k": 2, "share": 0.5},
                         {"name": "band", "type": "band_monitor", "attribute": "employment",
                          "value": "unemployed", "low": 10, "high": 100, "share": 0.5}])
    hh = tmp_path / "hh.yaml"
    hh.write_text(yaml.safe_dump(cfg))
    return hh


def test_the_simulator_fills_a_heavy_hitter_deployment(deployment, tmp_path):
    """Before: `produce` crashed with StopIteration on a deployment without a binary attribute, and
    `--attribute item` sent the poverty chain's 0/1 as hashed ids. Now every attribute is filled:
    the hashed one over its domain with planted shifting heavy hitters."""
    path, env = deployment
    hh = _heavy_hitter_config(path, tmp_path)
    with running(hh, env, tmp_path):
        proc = dpstream("produce", "--config", str(hh), "--simulate", env=env, check=False)
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert f"{N} accepted, 0 rejected" in proc.stdout, proc.stdout
    from pipeline.config import load_config
    from pipeline.sim.step_values import HEAVY_PER_PHASE, HEAVY_SHARE, PHASE, simulated_step

    dep = load_config(hh)
    steps = [simulated_step(dep, N, t, seed=2021) for t in (1, 2, PHASE + 1)]
    items = [s["item"] for s in steps]
    assert all(len(np.unique(i)) > N // 4 for i in items)  # spread over the domain, not 0/1
    holders = round(HEAVY_SHARE * N)
    heavy = []
    for i in items:  # HEAVY_PER_PHASE ids held by (at least: others may draw them) HEAVY_SHARE each
        ids, counts = np.unique(i, return_counts=True)
        assert (np.sort(counts)[-HEAVY_PER_PHASE:] >= holders).all()
        heavy.append(set(ids[counts >= holders].tolist()))
    assert heavy[0] == heavy[1] and heavy[0] != heavy[2]  # fixed within a phase, shifting between
    assert set(np.unique(steps[0]["employment"]).tolist()) == {0, 1, 2}
    kept = (steps[0]["employment"] == steps[1]["employment"]).mean()
    assert kept > 0.85  # persistence 0.9 (and redraws that fall on the same label)
    # the same seed continues the same panel: step 2 drawn alone equals step 2 drawn again
    assert (simulated_step(dep, N, 2, seed=2021)["item"] == items[1]).all()


def test_out_of_domain_names_the_allowed_values_and_case_sensitivity(deployment, tmp_path):
    """Before: `out_of_domain: value 'Employed' is outside the domain of 'employment'`, nothing
    about what is allowed. The check of a file (before sending) and the workers' parser (single
    reports and columnar batches) now list the declared labels and say matching is
    case-sensitive."""
    from pipeline.config import load_config
    from pipeline.stream.ingest.reports import ReportParser
    from pipeline.stream.ingest.roster import Roster

    path, env = deployment
    hh = _heavy_hitter_config(path, tmp_path)
    bad = tmp_path / "bad.csv"
    bad.write_text("user,step,item,employment\nu0,1,apple,employed\nu1,1,pear,Employed\n")
    proc = dpstream("produce", "--config", str(hh), "--csv", str(bad), env=env, check=False)
    assert proc.returncode == 2, proc.stderr
    # a CSV's cells are labels (a number too): its message offers no codes, a JSON report's does
    assert (f"{bad}:3: column 4 ('employment'): out_of_domain: value 'Employed' is outside the "
            "domain of 'employment'; allowed: 'employed', 'unemployed', 'inactive' (in a CSV a "
            "cell is a label, a number too: codes are for JSONL and Parquet); labels match "
            "exactly (case-sensitive") in proc.stderr, proc.stderr
    bad.write_text("user,step,item,employment\nu0,1,apple,1\n")
    proc = dpstream("produce", "--config", str(hh), "--csv", str(bad), "--dry-run", env=env, check=False)
    assert proc.returncode == 2 and "value '1' is outside the domain of 'employment'" in proc.stderr
    assert "a number too" in proc.stderr and "or a code" not in proc.stderr, proc.stderr
    dep = load_config(hh)
    parser = ReportParser(Roster.from_config(dep.roster), dep.attributes, dep.horizon)
    columnar = json.dumps({"columns": {"user": ["u0", "u1"], "step": 1,
                                       "employment": ["employed", "EMPLOYED"]}})
    single = json.dumps({"user": "u2", "step": 1, "values": {"employment": "Employed "}})
    details = [r.detail for r in parser.parse([columnar.encode(), single.encode()]).rejections]
    assert len(details) == 2
    assert all("allowed: 'employed', 'unemployed', 'inactive', or a code in 0..2" in d for d in details)
    assert "'EMPLOYED'" in details[0] and "case-sensitive" in details[1]
    # a long list is cut, and says how many labels there are
    labels = [f"job{i}" for i in range(500)]
    jobs = dep.attributes["employment"].model_copy(update={"values": labels})
    report = json.dumps({"user": "u0", "step": 1, "values": {"job": "Job1"}}).encode()
    parser = ReportParser(Roster.from_config(dep.roster), {"job": jobs}, dep.horizon)
    parsed = parser.parse([report])
    detail = parsed.rejections[0].detail
    assert "'job11', … (500 labels in all" in detail and "'job12'" not in detail
    assert len(detail) < 400
