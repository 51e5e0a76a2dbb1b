"""The send loop: a window of pages in flight over a client group."""

import argparse
import asyncio
import contextlib
import functools
import httpx
import os
import sys
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor

from blocks.common.arguments import option
from blocks.common.errors import EXIT_USAGE, RunAborted
from blocks.common.inputs import iter_image_cells
from blocks.common.rows import exception_row, PAGE, read_page, RowResult, SERVER
from blocks.common.saving import finish_row, HeldFailures
from blocks.server.process import ServerManager
from blocks.server.requests import request_body, SEND_AGAIN, send_until_clean

class ClientGroup(contextlib.AsyncExitStack):
    """httpx clients of at most 16 requests each: httpx scans its whole pool per request."""

    def __init__(self, **client_kwargs):
        super().__init__()  # closes every client on exit
        self.client_kwargs, self.clients = client_kwargs, {}  # client: its requests in flight

    async def request(self, method: str, url: str, **kwargs) -> httpx.Response:
        client = min(self.clients, key=self.clients.__getitem__, default=None)
        if client is None or self.clients[client] >= 16:
            client = httpx.AsyncClient(**self.client_kwargs)
            self.push_async_callback(client.aclose)
            self.clients[client] = 0
        self.clients[client] += 1
        try:
            return await client.request(method, url, **kwargs)
        finally:
            self.clients[client] -= 1

    post = functools.partialmethod(request, "POST")
    get = functools.partialmethod(request, "GET")


PAGES_PER_ENGINE = 32  # the measured window: on l4x1 the KV cache was under 10% used at 32


class Window:
    """Pages in flight, at most --concurrency (AdaptiveWindow adapts)."""

    def __init__(self, args, run):
        self.limit, self.used, self.preparing = max(1, args.concurrency or PAGES_PER_ENGINE), 0, 0
        self.changed = asyncio.Event()  # a slot given back, the limit raised, or the run stopped
        self.body_sizes: deque[int] = deque(maxlen=256)  # of recent requests
        self.input_done = self.stopped = False

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser, group) -> None:
        option(group, "--concurrency", type=int, at_least=1, default=None, identity=False,
               help=f"pages in flight (default: {PAGES_PER_ENGINE} per engine of the server, the "
               f"measured setting)")

    @staticmethod
    def serve_args(args, serve_args: list[str]) -> list[str]:  # for a server started here
        return []

    async def acquire(self) -> bool:
        """A slot for the next page; False once the run stopped (unstarted pages give none back)."""
        while self.used >= self.limit and not self.stopped:
            self.changed.clear()
            await self.changed.wait()
        self.used += 1
        return not self.stopped

    def release(self) -> None:
        self.used -= 1
        self.changed.set()

    def resize(self, limit: int) -> None:
        self.limit = max(1, limit)
        self.changed.set()

    async def adapt(self, client, server: "ServerManager") -> None:
        """Resize the window while the pages run (an adaptive one does)."""

    async def sample(self, client, server: "ServerManager") -> None:
        """Read the server's gauges and decide (an adaptive one does)."""

    def summary(self) -> dict:
        return {}


def holds_interrupt(exc) -> bool:
    """A KeyboardInterrupt, or an exception group holding one (a signal in anyio's connect)."""
    return isinstance(exc, KeyboardInterrupt) or any(map(holds_interrupt,
                                                         getattr(exc, "exceptions", ())))


def run_async(work, interrupts) -> None:
    """asyncio.run; a signal cancels the work at its next await (Interrupts.task), which then
    stops the run as a KeyboardInterrupt, said once (any_stop_said), not as a traceback."""
    async def quietly():
        asyncio.get_running_loop().set_exception_handler(
            lambda loop, context: holds_interrupt(context.get("exception")) or
            loop.default_exception_handler(context))
        interrupts.task = asyncio.current_task()
        try:
            await work
        except asyncio.CancelledError:
            if interrupts.signum is None:
                raise
            raise KeyboardInterrupt from None
        finally:
            interrupts.task = None

    asyncio.run(quietly())


async def run_server_pipeline(run, args, server: ServerManager, window: Window) -> None:
    """Start or reuse the server, then keep the window full until every pending row is done."""
    from tqdm import tqdm

    loop, stats, writer = asyncio.get_running_loop(), run.stats, run.writer
    write_lock = asyncio.Lock()
    storm = HeldFailures(SERVER, args.abort_after_failures, args.abort_after_seconds,
                         "all failed on the server's side over {:.0f} s")
    failure: list[BaseException] = []
    tasks: set[asyncio.Task] = set()

    def stop(exc: BaseException) -> None:  # the pages in flight stay pending
        failure.append(exc)
        window.stopped = True
        window.changed.set()
        for task in tasks - {asyncio.current_task()}:
            task.cancel()

    server.log_path = run.store.meta / "logs" / server.log_path.name
    async with ClientGroup(timeout=httpx.Timeout(args.request_timeout, connect=30.0)) as client:
        # what the exit undoes, last first: the tasks, the bar, the pools, the window's stats
        client.callback(lambda: stats.extra.update(window.summary()))
        write_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="write")
        client.callback(write_pool.shutdown, wait=True)
        prep_pool = ThreadPoolExecutor(max_workers=max(2, min(8, os.cpu_count() or 2)),
                                       thread_name_prefix="prepare")
        client.callback(prep_pool.shutdown, wait=False, cancel_futures=True)
        await server.start(client, stats)
        writer.info_entry.update(vllm_version=server.version, model_revision=server.revision)
        if not args.concurrency and server.engines > 1:  # a window for every engine
            window.resize(max(window.limit, PAGES_PER_ENGINE * server.engines))
        bar = tqdm(total=len(run.plan.send), unit="page", dynamic_ncols=True, smoothing=0.1,
                   mininterval=0.5 if sys.stderr.isatty() else 10.0)
        client.callback(bar.close)
        adapting = asyncio.create_task(window.adapt(client, server))
        client.callback(adapting.cancel)

        async def one(index: int, cell) -> None:
            latency = None
            stats.enter()  # in the task: one cancelled before it began neither enters nor leaves
            try:
                held = cell.get("bytes") if isinstance(cell, dict) else cell
                window.preparing += 1  # bytes in memory go out as they are: no pool hop
                page = isinstance(held, (bytes, bytearray, memoryview)) and \
                    read_page(cell, args, decode=False) or \
                    await loop.run_in_executor(prep_pool, read_page, cell, args, run.renderer)
                window.preparing -= 1
                if isinstance(page, RowResult):  # not sent: its error, or its text layer
                    result = page
                else:
                    layer, digest, size = page.text_layer, page.digest, (page.width, page.height)
                    body = request_body(page, server.model_name, args)
                    del page, cell, held
                    window.body_sizes.append(len(body))
                    sent = time.monotonic()
                    result = await send_until_clean(client, server, body, index, args)
                    if SEND_AGAIN is not None:  # e.g. olmOCR-2: a page said rotated, turned
                        result = await SEND_AGAIN(functools.partial(
                            send_until_clean, client, server, index=index, args=args),
                            body, result, args)
                    del body
                    latency = time.monotonic() - sent
                    result.text_layer, result.digest, result.sent_size = layer, digest, size
            except RunAborted as exc:
                return stop(exc)
            except Exception as exc:  # preparing or sending the page: this row fails, not the run
                result = exception_row(exc, PAGE)
            finally:
                stats.leave()
                window.release()  # the answer is in: the next page may go
            try:
                finish_row(writer, stats, storm, index, result, latency)
            except RunAborted as exc:  # nothing written: degenerate, or held by the storm
                return stop(exc)
            bar.update(1)
            if result.error is not None:
                bar.set_postfix(errors=stats.errors_seen, refresh=False)
            if writer.store.conflict:
                return stop(RunAborted(writer.store.conflict, EXIT_USAGE))
            if writer.due():
                async with write_lock:
                    await loop.run_in_executor(write_pool, writer.flush, False)
            writer.store.commit_if_due()

        watching = asyncio.create_task(server.watch(client, stats, storm))
        watching.add_done_callback(lambda watch: watch.cancelled() or stop(watch.exception()))
        client.callback(watching.cancel)
        for index, cell in iter_image_cells(run.source, run.plan.send):
            if not await window.acquire():
                break
            task = asyncio.create_task(one(index, cell))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        window.input_done = True
        while tasks and not failure:
            await asyncio.wait(set(tasks), return_when=asyncio.FIRST_COMPLETED)
        if failure:
            await asyncio.gather(*tasks, return_exceptions=True)
            raise failure[0]
        storm.at_end(writer)
        adapting.cancel()  # then one last sample: the final state, the final counters
        await asyncio.gather(adapting, return_exceptions=True)
        await window.sample(client, server)
