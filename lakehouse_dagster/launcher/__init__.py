"""A run launcher that starts each run in a child forked from a warm forkserver (see launcher.py)."""

from .launcher import WarmRunLauncher

__all__ = ["WarmRunLauncher"]
