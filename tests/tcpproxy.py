"""A TCP proxy on 127.0.0.1 between a client and a real server, to cut the wire on demand:
`drop()` resets every open connection (a watch dropped mid-stream, as a load balancer or
an apiserver restart does), `down()` refuses new ones until `up()`. The bytes are the
real server's (TLS passes through untouched); only the wire is faked."""

from __future__ import annotations

import contextlib
import socket
import struct
import threading


class TcpProxy:
    def __init__(self, upstream: tuple[str, int]):
        self.upstream = upstream
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._accepting = False
        self.accepted = 0
        self.up()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def up(self) -> None:
        if self._accepting:
            return
        if self._listener.fileno() < 0:  # closed by down(): listen again on the same port
            self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind(("127.0.0.1", self.port))
        self._listener.listen(16)
        self._accepting = True
        threading.Thread(target=self._accept, args=(self._listener,), daemon=True).start()

    def down(self) -> None:
        """Refuse new connections and reset the open ones."""
        self._accepting = False
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self.drop()

    def drop(self) -> None:
        """Reset every open connection (RST, not a clean close)."""
        with self._lock:
            sockets, self._open = self._open, set()
        for s in sockets:
            with contextlib.suppress(OSError):
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def close(self) -> None:
        self.down()

    def _accept(self, listener: socket.socket) -> None:
        while self._accepting:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
            except OSError:
                conn.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open |= {conn, upstream}
                self.accepted += 1
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
