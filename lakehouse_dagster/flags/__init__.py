"""Read and write flags: the registry (registry.py), runtime overrides + audit (overrides.py),
precedence and clamp coded once (precedence.py), the TTL-cached resolver (resolver.py) and which
datasets are native (native.py); the reverse mirror's on/off setting (reverse_setting.py).

Plain functions over explicit arguments; never imports dagster.
"""

from lakehouse_dagster.flags.native import native_dataset_ids
from lakehouse_dagster.flags.overrides import clear_override, history, list_overrides, set_override
from lakehouse_dagster.flags.registry import READ, READERS, WRITE, WRITERS, get_flag
from lakehouse_dagster.flags.resolver import FlagResolver, Resolution, invalidate_local

__all__ = [
    "READ",
    "WRITE",
    "READERS",
    "WRITERS",
    "get_flag",
    "FlagResolver",
    "Resolution",
    "invalidate_local",
    "set_override",
    "clear_override",
    "list_overrides",
    "history",
    "native_dataset_ids",
]
