"""TCP ports for the tests' servers, with no moment at which another process can take them.

Picking a port by binding port 0 and closing the socket leaves a gap before the server binds
it: pytest-xdist's other worker, or any outgoing connection (whose own port comes from the
same ephemeral range), can take the port in that gap, and the server fails to start or, worse,
the test talks to someone else's server. So:

- a server in this process is handed the bound socket itself (`bound_socket`; uvicorn's
  `Server.run(sockets=[...])`, asyncio's `create_server(sock=...)` listen on it);
- a server in a child process (`kvmem serve --port N`) gets a port held by `PortHold`: a
  socket bound with SO_REUSEADDR that never listens. While it is open the kernel gives the
  port to no one else (neither `bind(("", 0))` nor `connect()` picks a bound port), yet the
  child can still bind and listen on it: Linux lets SO_REUSEADDR sockets share an address as
  long as none of them listens, and uvicorn (through asyncio) binds with SO_REUSEADDR. Close
  the hold when the child is gone, not before: a restarted child finds its port still free.

This is Linux's behaviour (the suite's platform); BSD kernels share a port only under
SO_REUSEPORT.
"""

from __future__ import annotations

import socket
from types import TracebackType

HOST = "127.0.0.1"


def bound_socket(host: str = HOST) -> socket.socket:
    """A TCP socket bound to a port of the kernel's choosing on `host`, for a server in this
    process to listen on (the caller owns it; the server closes it when it stops)."""
    sock = socket.socket()
    try:
        sock.bind((host, 0))
    except OSError:
        sock.close()
        raise
    return sock


class PortHold:
    """A port on `host` kept from everyone but a child process that binds it explicitly."""

    def __init__(self, host: str = HOST) -> None:
        self._socket = socket.socket()
        try:
            self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._socket.bind((host, 0))
        except OSError:
            self._socket.close()
            raise
        self.port: int = self._socket.getsockname()[1]

    def close(self) -> None:
        """Give the port back (once the child that serves on it has exited)."""
        self._socket.close()

    def __enter__(self) -> PortHold:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
