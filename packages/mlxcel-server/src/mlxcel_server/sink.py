"""An output sink that hands engine outputs to the event loop."""

from __future__ import annotations

import asyncio

from mlxcel_core.engine import EngineOutput


class AsyncOutputQueue:
    """Receives outputs on the engine thread; a coroutine awaits them on the event loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[EngineOutput] = asyncio.Queue()

    def put(self, output: EngineOutput) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, output)
        except RuntimeError:
            # The loop has closed: the request that wanted this output is gone.
            return

    async def get(self) -> EngineOutput:
        """The next output."""
        return await self._queue.get()
