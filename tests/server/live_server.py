"""A dflash-serve app run by uvicorn on 127.0.0.1 (a free port) in a background thread."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import uvicorn
from dflash_serve.app import create_app
from dflash_serve.settings import Settings

FAKE_ONLY = os.environ.get("DFLASH_SERVER_FAKE_ONLY") == "1"


class LiveServer:
    """uvicorn on 127.0.0.1 (a free port) in a background thread."""

    def __init__(self, settings: Settings, factory: Callable[[], Any]):
        self.app = create_app(settings, factory)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, log_config=None, access_log=False, timeout_graceful_shutdown=2)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def worker(self) -> Any:
        return self.app.state.worker

    def start(self, wait_ready: bool = True) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline and self.thread.is_alive(), "server did not start"
            time.sleep(0.01)
        if wait_ready:
            assert self.worker.wait_ready(60), f"engine not ready: {self.worker.load_error}"
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()

    def client(self, **kw: Any) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kw.pop("timeout", 30), **kw)
