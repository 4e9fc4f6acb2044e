"""Child processes that a test interrupts.

A script that starts ``python -m pytest ... &`` without job control starts it with SIGINT ignored; its
children inherit that, and Python then never raises KeyboardInterrupt in them, so a test that sends
SIGINT to a child would wait for nothing (../shared/STACK.md, 'Processes and signals'). Such children
are started with SIGINT at its default, as a terminal, ``timeout`` and CI start commands."""
from __future__ import annotations

import signal


def sigint_at_default() -> None:
    """``preexec_fn`` of a child that the test sends SIGINT: Python installs its Ctrl-C handler."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
