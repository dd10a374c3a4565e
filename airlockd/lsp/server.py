"""The airlockd language server: the server class and `create_server()`, which wires the features.

Each feature lives in its own module with a `setup(server)` function; handlers there are thin and
call logic that is testable without a client. Blocking work (the store, Docker, copying, hashing)
never runs on the event loop: `call()` sends it to a thread, `spawn()` keeps background tasks.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from lsprotocol import types
from pygls.lsp.server import LanguageServer

from airlockd import __version__
from airlockd.runs.service import Service

if TYPE_CHECKING:
    from airlockd.lsp.control import ControlServer
    from airlockd.lsp.follow import StoreFollower

log = logging.getLogger(__name__)
T = TypeVar("T")


class AirlockServer(LanguageServer):
    """One workspace's airlockd behind LSP. Owns no run logic: that is the Service's."""

    def __init__(self, service: Service) -> None:
        super().__init__("airlockd", __version__, text_document_sync_kind=types.TextDocumentSyncKind.Incremental)
        self.service = service
        # what a client that never said `initialize` can do (a background daemon has none): nothing
        self.protocol.client_capabilities = types.ClientCapabilities()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tasks: set[asyncio.Task[Any]] = set()
        # Decisions (approve / reject / undo / conflict marks / expiry) one at a time, so the
        # watcher never judges a file between a commit and the record of it.
        self.decisions = threading.Lock()
        # Runs hold a thread for minutes; they get their own pool so requests never queue behind them.
        self.run_processes: dict[str, asyncio.subprocess.Process] = {}  # run id -> the process carrying it
        self.on_proposal_change: list[Callable[[str], None]] = []  # watching, codelens refresh
        self.run_list: Any = None  # commands.RunList, made on first use
        self.launcher: Any = None  # launcher.Launcher: forks run processes (None: each is started anew)
        self.control: ControlServer | None = None  # the control socket the CLI reaches this daemon on
        self.upkeep_started = False
        self.follower: StoreFollower | None = None  # what changed runs outside this daemon (follow.py)

    # -- threads and tasks --------------------------------------------------------------------

    async def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run blocking `fn` in a worker thread; the loop keeps answering meanwhile."""
        return await asyncio.to_thread(fn, *args, **kwargs)

    async def decide(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Like `call`, holding the decisions lock in the worker thread."""

        def locked() -> T:
            with self.decisions:
                return fn(*args, **kwargs)

        return await asyncio.to_thread(locked)

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str = "") -> asyncio.Task[Any]:
        """A background task that is kept alive and whose failure is logged, never lost."""
        task = asyncio.ensure_future(coro)
        task.set_name(name or repr(coro))
        self.tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("background task %s failed", task.get_name(), exc_info=exc)

    def from_thread(self, fn: Callable[..., Any], *args: Any) -> None:
        """Call `fn(*args)` on the event loop from any thread (a no-op before the loop is known)."""
        loop = self.loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(fn, *args)

    @property
    def has_client(self) -> bool:
        """Whether an editor is connected (a background daemon serves the control socket only)."""
        return self.protocol.writer is not None

    def notify(self, method: str, payload: Any) -> None:
        """Send a notification to the editor and to the control clients that asked for it; only
        ever on the loop thread."""
        if self.follower is not None:
            self.follower.announced(method, payload)
        if self.has_client:
            self.protocol.notify(method, payload)
        if self.control is not None:
            self.control.broadcast(method, payload)

    def tell_control(self, method: str, payload: Any) -> None:
        """A notification only the control clients hear (run progress and ends, for the CLI)."""
        if self.control is not None:
            self.control.broadcast(method, payload)

    def show(self, message: str, kind: types.MessageType = types.MessageType.Info) -> None:
        if self.has_client:
            self.window_show_message(types.ShowMessageParams(type=kind, message=message))

    async def wind_down(self) -> None:
        """Stop watching and keeping mirrors, and the launcher. The runs this daemon carries go
        on in their own processes (and are followed by whichever daemon serves next)."""
        from airlockd.lsp import watching

        watching.stop(self)
        self.service.close()
        if self.launcher is not None:
            await self.launcher.stop()
            self.launcher = None

    def start_upkeep(self) -> None:
        """Keep the mirrors and the launcher ready for runs (once; at `initialize`, or at the start
        of a daemon no editor talks to)."""
        from airlockd.lsp import follow, upkeep

        if self.upkeep_started:
            return
        self.upkeep_started = True
        self.loop = asyncio.get_running_loop()
        self.spawn(upkeep.prime(self), name="mirror keeper")
        self.spawn(upkeep.start_launcher(self), name="launcher")
        self.spawn(follow.follow(self), name="store follower")
        self.spawn(upkeep.sweep(self), name="sweep")
        self.spawn(upkeep.retain(self), name="retention")

    def proposal_changed(self, run_id: str) -> None:
        for fn in list(self.on_proposal_change):
            fn(run_id)


def create_server(service: Service) -> AirlockServer:
    """The server with every feature wired in."""
    from airlockd.lsp import codelens, commands, documents, status
    from airlockd.lsp import watching as watch

    server = AirlockServer(service)

    @server.feature(types.INITIALIZE)
    def initialize(ls: AirlockServer, params: types.InitializeParams) -> None:
        ls.start_upkeep()

    @server.feature(types.SHUTDOWN)
    async def shutdown(ls: AirlockServer, params: Any) -> None:
        await ls.wind_down()

    status.setup(server)
    commands.setup(server)
    documents.setup(server)
    codelens.setup(server)
    watch.setup(server)
    return server
