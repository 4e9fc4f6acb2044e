"""The code sandbox: untrusted (model-generated) programs run in processes of their own, each kept from
the machine, the network, our processes and each other (docs/sandbox.md). Tasks use it; it knows
nothing of tasks, models or runs.

    >>> from sbd_bench.sandbox import run_python
    >>> run_python("print(input()[::-1])", stdin="abc\\n").stdout             # 'cba\\n'

``jobs`` runs programs and judged sessions; ``cgroups`` gives a job one memory and process budget;
``seccomp`` the system calls it may not make; ``sandboxed/`` is what runs inside (the launcher, both
ends of a judged session's pipe).
"""
from .jobs import (Isolation, Limits, Outcome, SandboxError, Session, isolation, run_many, run_python,
                   run_session)

__all__ = ["Isolation", "Limits", "Outcome", "SandboxError", "Session", "isolation", "run_many", "run_python",
           "run_session"]
