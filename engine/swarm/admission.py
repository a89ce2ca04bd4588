"""The inbound handshake gate of a node's listener and of a bootstrap: a cap on open links and one per
remote address, answered in HTTP before any websocket frame is read (503: full; 429: that address
holds its share already), so one host opening sockets in a loop cannot take every slot.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from websockets.datastructures import Headers
from websockets.http11 import Response


def remote_ip(connection: Any) -> str:
    """The remote IP address of a server connection ("" where the transport does not say)."""
    address = getattr(connection, "remote_address", None)
    return str(address[0]) if address else ""


def _plain(status: int, reason: str, text: str) -> Response:
    return Response(status, reason, Headers({"Content-Type": "text/plain"}), text.encode())


class InboundGate:
    """Counts open inbound links per remote IP; `refuse` answers a handshake that would pass a cap.

    Runs on the server's loop only (websockets calls `process_request` and the handler there)."""

    def __init__(self, max_links: int, max_per_ip: int, full_text: str) -> None:
        self.max_links = max_links  # links of any kind (inbound and dialled) the server holds at most
        self.max_per_ip = max_per_ip  # open inbound links from one address (0: no such cap)
        self.full_text = full_text  # the 503's body: who is full
        self.per_ip: dict[str, int] = {}  # remote IP -> open inbound links
        self.refused_per_ip = 0  # handshakes refused by the per-address cap

    def refuse(self, connection: Any, open_links: int, stopping: bool) -> Response | None:
        """The HTTP refusal for this handshake, or None to let it through."""
        if open_links >= self.max_links or stopping:
            return _plain(503, "Service Unavailable", self.full_text)
        if self.max_per_ip and self.per_ip.get(remote_ip(connection), 0) >= self.max_per_ip:
            self.refused_per_ip += 1
            return _plain(429, "Too Many Requests", f"{self.max_per_ip} links from this address already\n")
        return None

    @contextlib.contextmanager
    def holding(self, connection: Any) -> Iterator[None]:
        """Count the connection against its address for as long as the block runs."""
        ip = remote_ip(connection)
        self.per_ip[ip] = self.per_ip.get(ip, 0) + 1
        try:
            yield
        finally:
            left = self.per_ip.pop(ip) - 1
            if left:  # an address with nothing open leaves no entry behind
                self.per_ip[ip] = left
