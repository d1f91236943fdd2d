"""Read and write flags, the face the adapters import: the registry of readers and writers (flags/registry.py), the
resolver (resolver.py), the runtime overrides and their history (overrides.py), setting and clearing a flag behind
its gates (gates.py), the soak (soak_setting.py), the shadow-read proof (proof.py), the Postgres-locked readers'
datasets (reader_datasets.py), the write-flip candidates (candidates.py), which datasets are native or flipped
(native.py, flipped.py) and the service's fallback incidents (incidents.py).

Each name loads its home module on first use (PEP 562), so a CLI verb's --help imports none of it."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lakehouse_dagster.flags.candidates import SAFE, write_flip_candidates
    from lakehouse_dagster.flags.flipped import flipped_dataset_ids
    from lakehouse_dagster.flags.gates import clear_flag, set_flag
    from lakehouse_dagster.flags.incidents import insert_fallback
    from lakehouse_dagster.flags.native import native_dataset_ids
    from lakehouse_dagster.flags.overrides import history, list_overrides, narrower_overrides, remaining_lines
    from lakehouse_dagster.flags.proof import (
        SHADOW_KEEP_DAYS,
        outcomes_in_window,
        proofs,
        prune_shadow_reads,
        set_threshold,
        threshold,
        threshold_history,
    )
    from lakehouse_dagster.flags.reader_datasets import declare, declared, remove
    from lakehouse_dagster.flags.registry import (
        FLIPPABLE_WRITERS,
        MODES,
        PROVEN_READERS,
        READ,
        READERS,
        REGISTRY,
        SERVABLE_READERS,
        WRITE,
        WRITERS,
        get_flag,
        rank,
    )
    from lakehouse_dagster.flags.resolver import CLAMPED, FlagResolver, Resolution
    from lakehouse_dagster.flags.soak_setting import current_soak, seed_soak, set_soak, soak_history

_HOME = {
    "FLIPPABLE_WRITERS": "lakehouse_dagster.flags.registry",
    "MODES": "lakehouse_dagster.flags.registry",
    "PROVEN_READERS": "lakehouse_dagster.flags.registry",
    "READ": "lakehouse_dagster.flags.registry",
    "READERS": "lakehouse_dagster.flags.registry",
    "REGISTRY": "lakehouse_dagster.flags.registry",
    "SERVABLE_READERS": "lakehouse_dagster.flags.registry",
    "WRITE": "lakehouse_dagster.flags.registry",
    "WRITERS": "lakehouse_dagster.flags.registry",
    "get_flag": "lakehouse_dagster.flags.registry",
    "rank": "lakehouse_dagster.flags.registry",
    "CLAMPED": "lakehouse_dagster.flags.resolver",
    "FlagResolver": "lakehouse_dagster.flags.resolver",
    "Resolution": "lakehouse_dagster.flags.resolver",
    "history": "lakehouse_dagster.flags.overrides",
    "list_overrides": "lakehouse_dagster.flags.overrides",
    "narrower_overrides": "lakehouse_dagster.flags.overrides",
    "remaining_lines": "lakehouse_dagster.flags.overrides",
    "clear_flag": "lakehouse_dagster.flags.gates",
    "set_flag": "lakehouse_dagster.flags.gates",
    "current_soak": "lakehouse_dagster.flags.soak_setting",
    "seed_soak": "lakehouse_dagster.flags.soak_setting",
    "set_soak": "lakehouse_dagster.flags.soak_setting",
    "soak_history": "lakehouse_dagster.flags.soak_setting",
    "SHADOW_KEEP_DAYS": "lakehouse_dagster.flags.proof",
    "outcomes_in_window": "lakehouse_dagster.flags.proof",
    "proofs": "lakehouse_dagster.flags.proof",
    "prune_shadow_reads": "lakehouse_dagster.flags.proof",
    "set_threshold": "lakehouse_dagster.flags.proof",
    "threshold": "lakehouse_dagster.flags.proof",
    "threshold_history": "lakehouse_dagster.flags.proof",
    "declare": "lakehouse_dagster.flags.reader_datasets",
    "declared": "lakehouse_dagster.flags.reader_datasets",
    "remove": "lakehouse_dagster.flags.reader_datasets",
    "SAFE": "lakehouse_dagster.flags.candidates",
    "write_flip_candidates": "lakehouse_dagster.flags.candidates",
    "native_dataset_ids": "lakehouse_dagster.flags.native",
    "flipped_dataset_ids": "lakehouse_dagster.flags.flipped",
    "insert_fallback": "lakehouse_dagster.flags.incidents",
}

__all__ = [
    "CLAMPED",
    "FLIPPABLE_WRITERS",
    "FlagResolver",
    "MODES",
    "PROVEN_READERS",
    "READ",
    "READERS",
    "REGISTRY",
    "Resolution",
    "SAFE",
    "SERVABLE_READERS",
    "SHADOW_KEEP_DAYS",
    "WRITE",
    "WRITERS",
    "clear_flag",
    "current_soak",
    "declare",
    "declared",
    "flipped_dataset_ids",
    "get_flag",
    "history",
    "insert_fallback",
    "list_overrides",
    "narrower_overrides",
    "native_dataset_ids",
    "outcomes_in_window",
    "proofs",
    "prune_shadow_reads",
    "rank",
    "remaining_lines",
    "remove",
    "seed_soak",
    "set_flag",
    "set_soak",
    "set_threshold",
    "soak_history",
    "threshold",
    "threshold_history",
    "write_flip_candidates",
]


def __getattr__(name: str) -> Any:
    if name not in _HOME:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOME[name]), name)
