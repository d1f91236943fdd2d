"""The service under load with Postgres restarted in the middle: the driver of test_service_faults.py's short run and
bench/bench_service_faults.py's long one.

Clients loop on 1,000-row reads (80%: ``export.stream`` from Iceberg or ``studio.digest`` from Postgres) and
ingests (20%: ``sync.full`` of a sourced dataset), with no retries, while the server's RSS is sampled; at
``restart_at`` the embedded Postgres is restarted with ``pg_ctl -m immediate``. Every answer is classified: 200,
a 5xx with ``Retry-After`` (503: Postgres unreachable, G2), anything else (unexpected: its first line kept), and
whether a body ever carried a stack trace. "Served after the restart": the answers of requests sent once
Postgres had been back for ``recovery_seconds``.
"""

from __future__ import annotations

import collections
import dataclasses
import random
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx

from lakehouse_dagster.testing.service import ServiceProcess, restart_postgres


@dataclasses.dataclass
class LoadUnderRestart:
    clients: int
    seconds: float
    statuses: dict[str, int]  # "read 200", "ingest 503", ...
    unexpected: list[str]  # answers other than 200 and a 5xx with Retry-After (their first lines, the first 20)
    unexpected_count: int
    cut: int  # requests whose answer broke off before its end (the client raises: never fewer rows)
    # of those: sent once Postgres was back (a defect). A read streaming from Postgres when it is killed can only
    # be cut (its 200 and first rows are sent): that is the documented mid-stream cut, never a short answer.
    cut_after_back: int
    tracebacks: int  # bodies with a stack trace in them
    restart_seconds: float  # pg_ctl restart -m immediate, from its start until it returned (Postgres back)
    first_ok_after_back_seconds: float | None  # from Postgres back to the first 200 read that started after it
    after_recovery: dict[str, int]  # statuses of requests sent recovery_seconds after Postgres came back
    after_recovery_not_served: int  # of those: not 200 (nor G2's 503 for an ingest)
    reads_per_s: float
    ingests_per_s: float
    rss_first_mb: float  # the server's RSS after the first 10% of the run
    rss_max_mb: float
    rss_last_mb: float

    def line(self) -> str:
        return (
            f"{self.clients} clients, {self.seconds:.0f} s, Postgres restarted (-m immediate, {self.restart_seconds:.1f}"
            f" s): statuses {self.statuses}; unexpected {self.unexpected_count}; cut {self.cut} ({self.cut_after_back} after "
            f"Postgres was back); stack traces "
            f"{self.tracebacks}; first 200 read {self.first_ok_after_back_seconds} s after Postgres was back; after "
            f"recovery {self.after_recovery} ({self.after_recovery_not_served} not served); reads {self.reads_per_s}/s,"
            f" ingests {self.ingests_per_s}/s; server RSS {self.rss_first_mb:.0f} → max {self.rss_max_mb:.0f}, last "
            f"{self.rss_last_mb:.0f} MB"
        )


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def run_load_with_restart(  # noqa: C901
    server: ServiceProcess,
    pgdata: Path,
    readable: list[uuid.UUID],
    sourced: list[uuid.UUID],
    *,
    clients: int,
    seconds: float,
    restart_at: float | None = None,
    recovery_seconds: float = 30.0,
    seed: int = 0,
    restart: Callable[[], None] | None = None,
) -> LoadUnderRestart:
    """Drive ``clients`` for ``seconds``; restart Postgres at ``restart_at`` s (default: the middle).
    Long on purpose: the clients, the restart and the sampler share one clock and one tally that the report reads."""
    restart_at = seconds / 2 if restart_at is None else restart_at
    restart = restart or (lambda: restart_postgres(pgdata))
    t0 = time.monotonic()
    stop_at = t0 + seconds
    lock = threading.Lock()
    answers: list[tuple[float, str, int, bool]] = []  # (sent, kind, status, retry-after present)
    unexpected: list[str] = []
    counts = {"unexpected": 0, "cut": 0, "tracebacks": 0}
    cut_sent: list[float] = []
    window: dict[str, float] = {}
    rss: list[tuple[float, float]] = []
    headers = {"Authorization": f"Bearer {server.token}"} if server.token else {}

    def worker(n: int) -> None:
        rnd = random.Random(seed * 1000 + n)
        with httpx.Client(base_url=server.url, headers=headers, timeout=120) as http:
            while time.monotonic() < stop_at:
                if rnd.random() < 0.8 or not sourced:
                    kind = "read"
                    body = {
                        "reader": rnd.choice(["export.stream", "studio.digest"]),
                        "dataset_id": str(rnd.choice(readable)),
                        "limit": 1000,
                    }
                else:
                    kind = "ingest"
                    body = {"dataset_id": str(rnd.choice(sourced)), "writer": "sync.full"}
                sent = time.monotonic()
                try:
                    resp = http.post(f"/lakehouse/{kind}", json=body)
                    text = resp.text
                except httpx.HTTPError as exc:
                    with lock:
                        counts["cut"] += 1
                        cut_sent.append(sent)
                        if len(unexpected) < 20:
                            unexpected.append(f"{kind} cut: {type(exc).__name__}: {exc}"[:300])
                    time.sleep(0.05)
                    continue
                retry = "retry-after" in resp.headers
                with lock:
                    answers.append((sent, kind, resp.status_code, retry))
                    if "Traceback" in text or 'File "' in text:
                        counts["tracebacks"] += 1
                    if resp.status_code != 200 and not (resp.status_code >= 500 and retry):
                        counts["unexpected"] += 1
                        if len(unexpected) < 20:
                            unexpected.append(f"{kind} {resp.status_code}: {text[:300]}")
                if resp.status_code != 200:
                    time.sleep(0.05)  # no retry, but no spin either

    def sampler() -> None:
        while time.monotonic() < stop_at:
            try:
                rss.append((time.monotonic() - t0, _rss_mb(server.proc.pid)))
            except OSError:
                return
            time.sleep(0.5)

    def restarter() -> None:
        time.sleep(max(0.0, t0 + restart_at - time.monotonic()))
        window["down"] = time.monotonic()
        restart()
        window["back"] = time.monotonic()

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(clients)]
    threads += [threading.Thread(target=sampler, daemon=True), threading.Thread(target=restarter, daemon=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    back = window["back"]
    statuses = collections.Counter(f"{k} {s}" for _, k, s, _ in answers)
    late = [(k, s) for sent, k, s, _ in answers if sent >= back + recovery_seconds]
    after = collections.Counter(f"{k} {s}" for k, s in late)
    not_served = sum(1 for k, s in late if s != 200 and not (k == "ingest" and s == 503))
    first_ok = min((sent for sent, k, s, _ in answers if k == "read" and s == 200 and sent >= back), default=None)
    first_tenth = [mb for at, mb in rss if at >= seconds / 10] or [mb for _, mb in rss]
    return LoadUnderRestart(
        clients=clients,
        seconds=round(wall, 1),
        statuses=dict(sorted(statuses.items())),
        unexpected=unexpected,
        unexpected_count=counts["unexpected"],
        cut=counts["cut"],
        cut_after_back=sum(1 for sent in cut_sent if sent >= back),
        tracebacks=counts["tracebacks"],
        restart_seconds=round(back - window["down"], 2),
        first_ok_after_back_seconds=None if first_ok is None else round(first_ok - back, 2),
        after_recovery=dict(sorted(after.items())),
        after_recovery_not_served=not_served,
        reads_per_s=round(statuses.get("read 200", 0) / wall, 1),
        ingests_per_s=round(statuses.get("ingest 200", 0) / wall, 2),
        rss_first_mb=round(first_tenth[0], 1) if first_tenth else float("nan"),
        rss_max_mb=round(max(mb for _, mb in rss), 1) if rss else float("nan"),
        rss_last_mb=round(rss[-1][1], 1) if rss else float("nan"),
    )
