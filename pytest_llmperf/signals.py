"""Handing a signal on to the handler that was installed before ours.

Both of the package's signal handlers end this way: the server reaper (``servers/process.py``),
after stopping the servers, and a run's deferred signals (``load/interrupts.py``), once the event
loop has unwound. The previous handler is called when it is a Python callable; an ignored signal
stays ignored; SIGINT with no Python handler raises KeyboardInterrupt, as Python's own would; any
other signal gets its default disposition back and is sent again, so it does what it would have
done without us (SIGTERM ends the process).
"""

from __future__ import annotations

import os
import signal
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from types import FrameType


def chain(previous: Any, signum: int, frame: FrameType | None) -> None:
    """Deliver ``signum`` as the handler ``previous`` (what ``signal.getsignal`` returned) would."""
    if callable(previous):
        previous(signum, frame)
    elif previous == signal.SIG_IGN:
        return
    elif signum == signal.SIGINT:
        raise KeyboardInterrupt
    else:
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
