"""Blocking work off the event loop, in pools of its own kind (service/app.py's module docstring: why a slot is held
until the work ends, not until its request stops waiting)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import anyio
import anyio.lowlevel


async def blocking(limiter: anyio.CapacityLimiter, fn: Callable[..., Any], *args) -> Any:
    return await anyio.to_thread.run_sync(fn, *args, limiter=limiter)


DONE, NOT_STARTED, RUNNING = "done", "not-started", "running"


async def run_holding(  # noqa: C901 - the limiter, timeout and late-result handling of one blocking call share their state
    limiter: anyio.CapacityLimiter,
    timeout: float,
    fn: Callable[[], Any],
    late: Callable[[Any, BaseException | None], None],
    ended: Callable[[bool], None] | None = None,
) -> tuple[str, Any]:
    """``fn()`` in a worker thread that holds a slot of ``limiter`` until it returns, waited for at most
    ``timeout`` s in all (the wait for a slot included). Returns (DONE, its value) — its error is raised;
    (NOT_STARTED, None): no slot in time, ``fn`` never runs; (RUNNING, None): it started and goes on, its slot
    still held, and hands what it ends with to ``late(value, error)`` in its thread. ``ended(kept)`` runs on the
    event loop once, when the slot is let go of (by the thread, or here when ``fn`` never ran); ``kept``: the
    value goes to the caller (DONE without an error).

    anyio's ``abandon_on_cancel`` alone gives the limiter's token back when the wait is cancelled, while the
    thread runs on: the bound then counts requests waiting, not work running. Long on purpose: the slot's
    hand-over between the event loop and the thread is one protocol; split, its races would not read as one."""
    deadline = anyio.current_time() + timeout
    borrower = object()
    try:
        with anyio.move_on_after(timeout) as waited:
            await limiter.acquire_on_behalf_of(borrower)
    except BaseException:  # cancelled from outside while waiting (shutdown): anyio gave the slot back
        if ended is not None:
            ended(False)
        raise
    if waited.cancelled_caught:  # anyio gave the slot back, or never gave it
        if ended is not None:
            ended(False)
        return NOT_STARTED, None
    token = anyio.lowlevel.current_token()
    lock = threading.Lock()
    state: dict[str, Any] = {"started": False, "skipped": False, "abandoned": False}

    def release(kept: bool) -> None:
        limiter.release_on_behalf_of(borrower)
        if ended is not None:
            ended(kept)

    def work() -> Any:
        with lock:
            if state["skipped"]:
                return None
            state["started"] = True
        value, error = None, None
        try:
            value = fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting request, or to ``late``
            error = exc
        with lock:  # decided once: either the request takes the outcome, or ``late`` does
            abandoned = state["abandoned"]
            if not abandoned:
                state["outcome"] = (value, error)
        try:
            anyio.from_thread.run_sync(release, not abandoned and error is None, token=token)
        except RuntimeError:  # the event loop is gone (shutdown): nothing waits for the slot any more
            pass
        if abandoned:
            late(value, error)
            return None
        if error is not None:
            raise error
        return value

    def give_up() -> tuple[Any, BaseException | None] | None:
        """The wait ended before the work: its outcome if it just arrived, else skip it or leave it running."""
        with lock:
            outcome = state.get("outcome")
            if outcome is None:
                if state["started"]:
                    state["abandoned"] = True
                else:
                    state["skipped"] = True
        if state["skipped"]:
            release(False)
        return outcome

    try:
        with anyio.move_on_after(max(0.0, deadline - anyio.current_time())):
            # a limiter of its own: ``limiter``'s slot, held above, is the bound (not anyio's token)
            own = anyio.CapacityLimiter(1)
            return DONE, await anyio.to_thread.run_sync(work, limiter=own, abandon_on_cancel=True)
    except BaseException:  # its error, or cancelled from outside (shutdown): then as past the timeout
        outcome = give_up()
        if outcome is not None and outcome[1] is None and outcome[0] is not None:
            late(outcome[0], None)  # a value no one will take
        raise
    outcome = give_up()
    if outcome is not None:  # it ended just as the wait did: its answer stands
        if outcome[1] is not None:
            raise outcome[1]
        return DONE, outcome[0]
    return (NOT_STARTED if state["skipped"] else RUNNING), None
