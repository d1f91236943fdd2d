"""A real process kill as a move of the model with Iceberg (issue 42: "interleaved with the crash harness's kills"):
``lakehouse ingest`` of a native dataset run as its own process (testing/faults.py ``cli_popen``, as the crash
harness launches its verbs) with a fault point of the native path armed ``:kill`` — the process SIGKILLs itself
there: no handler, no rollback of ours, its session and advisory locks gone with it, as a crash or an OOM kill
leaves them. The other interrupted verbs of the model (crashes.py, ingest.py) raise in-process instead.

The oracle: the table holds the rows it held or those plus the killed ingest's, whole; the next ingest (in-process,
the service's way) settles what the dead process left (the reaper, under the dataset lock): no ``running`` sync-log
row stays, ``datasets.row_count`` is the table's count, and a file the dead process committed is never read again
(nor one it did not commit skipped)."""

from __future__ import annotations

import signal

from hypothesis import strategies as st

from lakehouse_dagster.lifecycle import states as S
from lakehouse_dagster.testing.faults import cli_env, cli_popen
from lakehouse_dagster.testing.lifecycle_model.ingest import NATIVE_POINTS
from lakehouse_dagster.testing.lifecycle_model.oracle import ModelParts
from lakehouse_dagster.testing.lifecycle_model.steps import rule


class KillMoves(ModelParts):
    """Mixed into ``LifecycleWithIceberg`` (iceberg.py): needs the ingest moves' files source (ingest.py)."""

    @rule(i=st.integers(0, 5), point=st.sampled_from(NATIVE_POINTS))
    def ingest_killed(self, i, point):
        """``lakehouse ingest`` of a native dataset and writer (``i`` picks them) killed by SIGKILL at ``point``,
        then the next ingest of the same writer."""
        native = [d for d in self.ids if self.o.state(d).state == S.NATIVE]
        if not native:  # no precondition: the draws never depend on the world's state (steps.py)
            return
        native = [d for d in native if d in self.readied] or native  # one readied the runbook's way passes the gates
        d = native[i % len(native)]
        writers = self.o.state(d).native_writers
        writer = writers[i % len(writers)]
        self._drop_file(d)
        before = self.iceberg_rows.get(d, 0)
        new = [f for f in self.files[d] if f not in self.read[d]]
        whole = len(self.files[d]) if writer == "sync.full" else before + len(new)
        self._audit_mark()
        proc = cli_popen("ingest", "--dataset", str(d), "--writer", writer, env=cli_env(f"{point}:kill"))
        _, err = proc.communicate(timeout=600)
        got = self._iceberg_count(d)[0]
        killed = proc.returncode == -signal.SIGKILL
        # not killed: 0, the point was not on its path; else refused before the write (a gate: the one-line reason
        # and the way on) or stopped by a first native write's canary after it
        assert killed or proc.returncode == 0 or "lakehouse " in err, f"ingest exited {proc.returncode}: {err[-500:]}"
        assert got in (before, whole), f"an ingest killed at {point} left {got} row(s) ({before} or {whole})"
        outcome = "committed" if got == whole and whole != before else "not committed"
        self._saw(
            f"ingest killed (SIGKILL) at {point}: {outcome}" if killed else f"ingest at {point}: exit {proc.returncode}"
        )
        if got == whole:
            self.read[d] = set(self.files[d])  # committed: its files were read (the ingest state is in the commit)
        self.iceberg_rows[d] = got
        self._follow_audit()  # a first native write's canary in the dead process may have rolled the writer back
        after = self._ingest(d, writer, "after a kill")  # the next ingest: lands what is new, reads nothing twice
        if after not in ("native", "nothing new"):
            return  # refused (the gates: a dataset made native past them) or rolled back: nothing of it ran natively
        running = self.conn.execute(
            "select count(*) from iceberg_sync_log where dataset_id = %s and status = 'running'", (d,)
        ).fetchone()[0]
        assert running == 0, f"{running} sync log row(s) of {d} still running after the next ingest"
        if after == "native":  # its commit recorded the table's count
            row_count = self.conn.execute("select row_count from datasets where id = %s", (d,)).fetchone()[0]
            table = self._iceberg_count(d)[0]
            assert row_count == table, (
                f"after a kill at {point}: datasets.row_count {row_count}, the table holds {table}"
            )
