"""The processes `lakehouse up` starts and stops besides its children: SeaweedFS (``--catalog rest``), the embedded
Postgres (stopped last), and the ``dagster dev`` command line.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from lakehouse_dagster.cli.up.shared import _first_line, _say

SEAWEED_DIR = "seaweed"  # under LAKEHOUSE_HOME: data/, weed.log, credentials (owner-only)


SEAWEED_CREDENTIALS = "credentials"


def start_seaweed(root: Path):
    """SeaweedFS under ``root``, with the access key and secret kept in ``root/credentials`` (made once, owner-only),
    ready once its catalog answers with them; the kernel stops it if `lakehouse up` dies. Never prints the secret."""
    from lakehouse_dagster.api.lake import (
        SeaweedServer,
        kept_credentials,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    credentials = kept_credentials(root / SEAWEED_CREDENTIALS)
    _say(f"starting SeaweedFS (S3 + Iceberg REST catalog) in {root}...")
    server = SeaweedServer(root, credentials=credentials, die_with_parent=True)
    _say(
        f"SeaweedFS ready: Iceberg REST catalog on {server.catalog_uri}, S3 on {server.s3_endpoint}, warehouse "
        f"{server.warehouse} (credentials in {root / SEAWEED_CREDENTIALS}, owner-only)"
    )
    return server


def stop_seaweed(server) -> None:
    """After Dagster and the API (nothing writes any more), before Postgres; a second Ctrl-C must not cut it short."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        server.close()
        _say("SeaweedFS stopped")
    except Exception as exc:
        _say(f"could not stop SeaweedFS cleanly: {_first_line(exc)} (its log: {server.log_path})")
    finally:
        signal.signal(signal.SIGINT, previous)


def stop_postgres(pgdata: Path, *, quiet: bool = False) -> bool:
    """Stop the embedded server of ``pgdata``: ``pg_ctl stop`` (as its system user), else SIGINT to the
    postmaster (Postgres' own "fast shutdown"), which also works when pg_ctl cannot reach the directory
    (e.g. a parent directory lost its o+x). True if a running server was stopped."""
    from lakehouse_dagster.cli.pg import (
        embedded_info,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)
    from lakehouse_dagster.core.embedded import (
        stop_embedded,
    )  # lazy: the CLI imports a verb's machinery only when that verb runs (a fast --help)

    say = (lambda msg: None) if quiet else _say
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not leave it half-stopped
    try:
        try:
            if stop_embedded(pgdata):
                say("embedded Postgres stopped")
                return True
        except Exception as exc:
            say(f"pg_ctl stop failed ({_first_line(exc)}); sending the postmaster a fast-shutdown signal")
        info = embedded_info(pgdata)
        if info is None:
            return False
        try:
            os.kill(info.pid, signal.SIGINT)
            info.process.wait(60)
            say("embedded Postgres stopped")
            return True
        except Exception as exc:
            say(f"could not stop the embedded Postgres in {pgdata}: {_first_line(exc)} (try: lakehouse pg stop)")
            return False
    finally:
        signal.signal(signal.SIGINT, previous)


def dagster_dev_cmd(host: str, port: int, workspace_file: Path, *, debug: bool) -> list[str]:
    """``dagster dev`` with Dagster's own services (daemon, webserver) at WARNING: their INFO lines (the run queue
    and run monitoring each second, each sensor launch, the start and stop steps) are chatter on an idle stack; runs
    and sensors log through loggers of their own and still reach the console. ``--debug`` keeps Dagster's INFO."""
    return [
        *(sys.executable, "-m", "dagster", "dev", "-h", host, "-p", str(port), "-w", str(workspace_file)),
        *("--log-level", "info" if debug else "warning"),
    ]
