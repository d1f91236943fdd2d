"""Every Postgres advisory lock the project takes, in one list, so no two can collide.

Advisory locks live in one space per database, shared with the live app. Ours use the two-int4 form
``(namespace, key)`` with a namespace of our own (``0x1A4E_....``), or the one-bigint form keyed by
``hashtextextended(<name>, 0)`` for a few named singletons. Keys derived from a dataset id hash the WHOLE id
(``dataset_key``): the first 32 bits of a v1/v7 uuid are a timestamp, so ids created within ~65 s would share a lock.

``test_locks.py`` checks that the namespaces are distinct and that no module takes a lock in a namespace that is
not listed here.
"""

from __future__ import annotations

import hashlib
import uuid

# (namespace, key) locks: each namespace once, with who takes it
MIGRATE = 0x1A4E_0001  # schema/migrate.py: one migration run at a time (single-bigint form, key = this value)
DEMO_SEED = 0x1A4E_0D30  # demo/workspace.py: one seeding of the demo at a time (single-bigint form)
PARITY_FILL = 0x1A4E_0015  # parity/maintained.py: one fill / compaction of a dataset's maintained digest
CAPTURE_CONSUME = 0x1A4E_0022  # tracking/capture/: one WAL consumer (or a fill behind it) at a time
DATASET = 0x1A4E_0100  # core/guards.py G3: one sync / native write / reverse apply / complete batch per dataset
ADMISSION = 0x1A4E_0200  # core/guards.py G2: one of max_concurrent_ingest slots
STREAM_SHARD = 0x1A4E_0300  # mirror/stream.py: one stream run per shard (key = shard_count << 16 | shard)
FIRST_NATIVE = 0x1A4E_0310  # core/guards.py: a first native write until its canary's verdict (was 0x0300: shared)
LIFECYCLE_ALL = 0x1A4E_0400  # lifecycle/lock.py: every dataset's lifecycle (a workspace/global verb: exclusive)
LIFECYCLE = 0x1A4E_0401  # lifecycle/lock.py: one dataset's lifecycle (a dataset verb exclusive, a write shared)

NAMESPACES: dict[str, int] = {
    "migrate": MIGRATE,
    "demo_seed": DEMO_SEED,
    "parity_fill": PARITY_FILL,
    "capture_consume": CAPTURE_CONSUME,
    "dataset (G3)": DATASET,
    "admission (G2)": ADMISSION,
    "stream_shard": STREAM_SHARD,
    "first_native": FIRST_NATIVE,
    "lifecycle_all": LIFECYCLE_ALL,
    "lifecycle": LIFECYCLE,
}

# single-bigint locks keyed by hashtextextended(name, 0): each name once
NAMED = (
    "lakehouse_sql_catalog_init",  # lake/catalog.py: one creation of the SqlCatalog's tables
    "lakehouse_flag_gates",  # flags/gates.py: every gated flag change
    "lakehouse_reverse_settings",  # flags/reverse_setting.py: one reverse setting change at a time
    "lakehouse_settings:soak_seconds",  # flags/soak_setting.py
    "lakehouse_flag:<kind>:<name>:<scope>:<id>",  # flags/overrides.py: one override key
)
# tracking/barrier.py keys the capture barrier by uuid_hash_extended(dataset, 0) in the single-bigint form: a
# 64-bit hash of the whole id, the app's statements take it shared.


def dataset_key(dataset_id: uuid.UUID) -> int:
    """A signed int4 key for a dataset's lock: a hash of the whole id (stable across processes and releases)."""
    return int.from_bytes(hashlib.blake2b(dataset_id.bytes, digest_size=4).digest(), "big", signed=True)
