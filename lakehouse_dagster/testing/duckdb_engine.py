"""A second Iceberg engine for the tests: DuckDB with its ``iceberg`` extension, attached to the REST catalog.

Issue 46 asks for another engine committing to (and reading) the project's tables through the REST endpoint, with
the project telling its commits apart (lake/foreign.py). DuckDB is that engine, but not the project's own duckdb:
the project pins duckdb 2.0.0 (parity/digest/), while DuckDB's extensions reach this machine only as PyPI wheels for
DuckDB 1.5.5 (``duckdb-extension-iceberg``/``-httpfs``/``-avro``, each requiring ``duckdb==1.5.5``; DuckDB's own
extension repository is not reachable, and an extension loads only into the version it was built for: 2.0.0
refuses the 1.5.5 file by name). They cannot be an extra beside the pinned stack, so ``ensure_installed`` puts
duckdb 1.5.5 and the three extensions with ``pip install --target`` into a directory of their own, once (cached
between runs, a file lock for parallel workers), and ``DuckDBIceberg`` runs DuckDB as a child process with that
directory first on its path. docs/rest-catalog.md says the same for operators.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from lakehouse_dagster.core.errors import LakehouseError

VERSION = "1.5.5"
EXTENSIONS = ("httpfs", "avro", "iceberg")  # load order: iceberg needs the other two
PACKAGES = (f"duckdb=={VERSION}", *(f"duckdb-extension-{e}=={VERSION}" for e in EXTENSIONS))
ALIAS = "lk"  # the attached catalog's name in the engine's SQL: lk."namespace"."table"

# The child: reads {"statements": [...]} on stdin, the server's address and credentials from its environment, and
# prints one JSON list (each statement's rows) on stdout. Secrets are DuckDB literals: CREATE SECRET takes no
# parameters, so they are quoted here (the values never reach a command line or a log).
_CHILD = """
import json, os, sys
import duckdb
root, version = os.environ["LH_DUCKDB_ROOT"], os.environ["LH_DUCKDB_VERSION"]
assert duckdb.__version__ == version, (duckdb.__version__, duckdb.__file__)
def q(v):
    return "'" + v.replace("'", "''") + "'"
con = duckdb.connect()
for e in os.environ["LH_DUCKDB_EXTENSIONS"].split(","):
    extension = f"{root}/duckdb_extension_{e}/extensions/v{version}/{e}.duckdb_extension"
    con.execute("LOAD " + q(extension))  # LOAD takes no parameter: a quoted literal
key, secret = os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]
endpoint = os.environ["LH_S3_ENDPOINT"]
con.execute(
    f"CREATE SECRET s3 (TYPE s3, KEY_ID {q(key)}, SECRET {q(secret)}, ENDPOINT {q(endpoint.split('://', 1)[1])}, "
    f"URL_STYLE 'path', USE_SSL {'true' if endpoint.startswith('https') else 'false'}, REGION 'us-east-1')"
)
uri = os.environ["LH_CATALOG_URI"]
con.execute(
    f"CREATE SECRET catalog (TYPE iceberg, CLIENT_ID {q(key)}, CLIENT_SECRET {q(secret)}, "
    f"OAUTH2_SERVER_URI {q(uri + '/v1/oauth/tokens')})"
)
warehouse = os.environ["LH_WAREHOUSE"].removeprefix("s3://")
alias = os.environ["LH_ALIAS"]
assert alias.isidentifier(), alias  # the module's constant ALIAS: an identifier, never a caller's text
con.execute("ATTACH " + q(warehouse) + " AS " + alias + " (TYPE iceberg, ENDPOINT " + q(uri) + ", SECRET catalog)")
out = []
for statement in json.load(sys.stdin)["statements"]:
    result = con.sql(statement)
    out.append([list(r) for r in result.fetchall()] if result is not None else [])
print(json.dumps(out, default=str))
"""


def default_dir() -> Path:
    """Where the side install lives: LAKEHOUSE_TEST_DUCKDB_DIR, else the user's cache (kept between runs)."""
    given = os.environ.get("LAKEHOUSE_TEST_DUCKDB_DIR")
    return Path(given) if given else Path.home() / ".cache" / "lakehouse-dagster" / f"duckdb-iceberg-{VERSION}"


def ensure_installed(target: Path | None = None) -> Path:
    """DuckDB ``VERSION`` and its extensions in ``target`` (installed from PyPI the first time); the directory."""
    target = target or default_dir()
    marker = target / ".installed"
    if marker.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test worker may be installing it right now
        if marker.exists():
            return target
        staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}."))
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input"]
        done = subprocess.run([*cmd, "--target", str(staging), *PACKAGES], capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            shutil.rmtree(staging, ignore_errors=True)
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise LakehouseError(
                f"DuckDB {VERSION} and its iceberg extension could not be installed from PyPI into {target} "
                f"(pip exit {done.returncode}: {last}); check that PyPI is reachable, or point "
                "LAKEHOUSE_TEST_DUCKDB_DIR at a directory made with `pip install --target DIR "
                + " ".join(PACKAGES)
                + "`"
            )
        (staging / ".installed").write_text(" ".join(PACKAGES) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    return target


class DuckDBIceberg:
    """DuckDB attached (as ``ALIAS``) to an Iceberg REST catalog whose warehouse is on S3: ``run`` executes SQL
    statements in one child process (one connection) and returns each statement's rows."""

    def __init__(
        self, root: Path, *, catalog_uri: str, warehouse: str, s3_endpoint: str, key: str, secret: str
    ) -> None:
        self.root = root
        self._env = {
            "LH_DUCKDB_ROOT": str(root),
            "LH_DUCKDB_VERSION": VERSION,
            "LH_DUCKDB_EXTENSIONS": ",".join(EXTENSIONS),
            "LH_CATALOG_URI": catalog_uri,
            "LH_WAREHOUSE": warehouse,
            "LH_S3_ENDPOINT": s3_endpoint,
            "LH_ALIAS": ALIAS,
            "AWS_ACCESS_KEY_ID": key,
            "AWS_SECRET_ACCESS_KEY": secret,
        }

    @classmethod
    def for_server(cls, server, root: Path | None = None) -> DuckDBIceberg:
        """Attached to a SeaweedServer's catalog and S3 (lake/seaweed.py)."""
        return cls(
            root or ensure_installed(),
            catalog_uri=server.catalog_uri,
            warehouse=server.warehouse,
            s3_endpoint=server.s3_endpoint,
            key=server.key,
            secret=server.secret,
        )

    @staticmethod
    def table(identifier: tuple[str, str]) -> str:
        """A project table's name in the engine's SQL (quoted: namespaces and names are the project's)."""
        return ".".join([ALIAS, *(f'"{part}"' for part in identifier)])

    def run(self, *statements: str, timeout: float = 180) -> list[list[list]]:
        env = {**os.environ, **self._env, "PYTHONPATH": str(self.root)}  # its duckdb before the venv's
        done = subprocess.run(
            [sys.executable, "-c", _CHILD],
            input=json.dumps({"statements": list(statements)}),
            capture_output=True,
            text=True,
            env=env,
            timeout=timeout,
        )
        if done.returncode != 0:
            raise LakehouseError(f"DuckDB {VERSION} failed (exit {done.returncode}): {done.stderr.strip()[-1500:]}")
        return json.loads(done.stdout)
