"""An address that does not answer, on loopback: a listener whose accept queue is full and never drained.

Linux drops a SYN to a listening socket whose accept queue is full, so a
``connect()`` there waits in SYN_SENT and retransmits, as one to a host
behind a cut link does: no reset, no error, for minutes.  It needs no root,
no namespace and no firewall, and it ends with the test (``close``).
"""

from __future__ import annotations

import socket
import time

FILLERS = 4  # connects that fill the queue (backlog 0 holds one; the rest wait in SYN_SENT)


class BlackHole:
    """``address`` (``127.0.0.1:PORT``) never answers a connect while this is open."""

    def __init__(self) -> None:
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(0)
        self.port = self._listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self._fillers: list[socket.socket] = []
        for _ in range(FILLERS):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", self.port))
            self._fillers.append(filler)
        self._check()

    def _check(self, wait: float = 0.3) -> None:
        """A probe connect must time out, or this is no black hole (a kernel that answers otherwise)."""
        time.sleep(0.1)  # the fillers' handshakes settle
        probe = socket.socket()
        probe.settimeout(wait)
        try:
            probe.connect(("127.0.0.1", self.port))
        except (TimeoutError, socket.timeout):
            return
        except OSError as error:
            self.close()
            raise RuntimeError(f"a connect to the black hole failed instead of hanging: {error}") from None
        finally:
            probe.close()
        self.close()
        raise RuntimeError("a connect to the black hole was answered")

    def close(self) -> None:
        for filler in self._fillers:
            filler.close()
        self._listener.close()

    def __enter__(self) -> "BlackHole":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
