"""A TCP proxy that makes a server slow on purpose, for tests: each chunk a client sends reaches the
server `delay_s` later (so each request round trip pays it; a pipelined batch pays it once), and
replies flow back at most `bytes_per_s`. Runs on its own thread; stop() closes everything.

    proxy = SlowProxy(("127.0.0.1", redis_port), delay_s=0.02, bytes_per_s=50e6).start()
    url = f"redis://127.0.0.1:{proxy.port}"
"""

from __future__ import annotations

import asyncio
import threading


class SlowProxy:
    def __init__(self, upstream: tuple[str, int], *, delay_s: float, bytes_per_s: float):
        self.upstream = upstream
        self.delay_s = delay_s
        self.bytes_per_s = bytes_per_s
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="slow-proxy",
                                        daemon=True)
        self._server = None
        self._tasks: set = set()

    def start(self) -> "SlowProxy":
        self._thread.start()
        fut = asyncio.run_coroutine_threadsafe(self._listen(), self._loop)
        self.port = fut.result(timeout=10)
        return self

    async def _listen(self) -> int:
        self._server = await asyncio.start_server(self._client, "127.0.0.1", 0)
        return self._server.sockets[0].getsockname()[1]

    async def _client(self, creader, cwriter) -> None:
        try:
            sreader, swriter = await asyncio.open_connection(*self.upstream)
        except OSError:
            cwriter.close()
            return
        up = asyncio.ensure_future(self._upstream(creader, swriter))
        down = asyncio.ensure_future(self._downstream(sreader, cwriter))
        self._tasks.update((up, down))
        await asyncio.wait([up, down], return_when=asyncio.FIRST_COMPLETED)
        for t in (up, down):
            t.cancel()
        for w in (swriter, cwriter):
            w.close()

    async def _upstream(self, reader, writer) -> None:
        # In order, each chunk held delay_s from the moment it arrived.
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        async def forward():
            while True:
                due, data = await queue.get()
                wait = due - loop.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                writer.write(data)
                await writer.drain()

        fwd = asyncio.ensure_future(forward())
        try:
            while data := await reader.read(1 << 16):
                queue.put_nowait((loop.time() + self.delay_s, data))
        finally:
            await asyncio.sleep(self.delay_s)
            fwd.cancel()

    async def _downstream(self, reader, writer) -> None:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
            await asyncio.sleep(len(data) / self.bytes_per_s)

    def stop(self) -> None:
        async def close():
            if self._server is not None:
                self._server.close()
            for t in self._tasks:
                t.cancel()

        asyncio.run_coroutine_threadsafe(close(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)


if __name__ == "__main__":
    # python slow_proxy.py UPSTREAM_PORT DELAY_S BYTES_PER_S: prints its port, runs until killed
    # (a process of its own, so a test can run it at low priority like the remote machine it
    # stands for).
    import sys

    p = SlowProxy(("127.0.0.1", int(sys.argv[1])), delay_s=float(sys.argv[2]),
                  bytes_per_s=float(sys.argv[3])).start()
    print(p.port, flush=True)
    threading.Event().wait()
