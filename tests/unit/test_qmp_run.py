"""``hpvc.backends.qemu.qmp.run``: a Ctrl-C during a QMP session reaches the caller.

CI of 2026-11-27 lost a Ctrl-C during a migration: ``asyncio.run`` turns
SIGINT into a task cancellation that ``wait_for`` may drop. ``run`` keeps the
interpreter's own handler, so the interrupt is a ``KeyboardInterrupt`` (CPython
still drops one raised inside an object's finalizer, in any program).
"""

from __future__ import annotations

import _thread
import asyncio
import signal
import threading

import pytest

from hpvc.backends.qemu.qmp import run


def test_run_returns_the_coroutines_value_and_leaves_sigint_alone() -> None:
    seen: list[object] = []

    async def session() -> int:
        seen.append(signal.getsignal(signal.SIGINT))
        await asyncio.sleep(0)
        return 7

    assert run(session()) == 7
    # asyncio.run would have put its own handler here for the session's length
    assert seen == [signal.default_int_handler]


def test_an_error_inside_is_raised_as_it_is() -> None:
    async def session() -> None:
        await asyncio.sleep(0)
        raise ValueError("no")

    with pytest.raises(ValueError, match="no"):
        run(session())


def test_ctrl_c_while_a_command_is_awaited_is_a_keyboard_interrupt_and_the_session_closes() -> None:
    closed: list[bool] = []

    async def session() -> None:
        try:
            for _ in range(2000):  # a poll loop of short commands, as a migration's
                await asyncio.wait_for(asyncio.sleep(0.001), 5.0)
        finally:
            await asyncio.sleep(0)  # an await in the cleanup, as disconnect() is
            closed.append(True)

    timer = threading.Timer(0.2, _thread.interrupt_main)
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            run(session())
    finally:
        timer.cancel()
    assert closed == [True]
