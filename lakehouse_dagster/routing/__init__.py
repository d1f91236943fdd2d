"""Routers: which engine serves a read (read_router.py) and where a write lands (write_router.py).

Plain functions over explicit arguments (a connection, a flag resolver, executors); never imports dagster.
"""
