"""A TCP server on one address for tests of what may and may not be reached: it counts the
connections it accepts, and then closes each at once (`close`), echoes what it gets (`echo`), or
sends `size` bytes (`send`)."""

from __future__ import annotations

import socket
import threading


class TcpServer:
    def __init__(self, host: str = "127.0.0.1", mode: str = "echo", size: int = 0) -> None:
        self.mode, self.size = mode, size
        self.srv = socket.create_server((host, 0))
        self.port = int(self.srv.getsockname()[1])
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            self.accepted += 1
            if self.mode == "close":
                c.close()
            else:
                threading.Thread(target=self._one, args=(c,), daemon=True).start()

    def _one(self, c: socket.socket) -> None:
        with c:
            try:
                if self.mode == "send":
                    block = b"x" * 65536
                    left = self.size
                    while left > 0:
                        c.sendall(block[: min(left, len(block))])
                        left -= len(block)
                    return
                while data := c.recv(65536):
                    c.sendall(data)
            except OSError:
                pass

    def close(self) -> None:
        self.srv.close()
