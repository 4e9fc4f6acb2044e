"""Runs untrusted (model-generated) Python programs, each in its own process, and says what happened.

    >>> outcome = run_python("print(input()[::-1])", stdin="abc\\n")
    >>> outcome.status, outcome.stdout          # ('passed', 'cba\\n')

Every program gets, on Linux:
  * a fresh temporary working directory (also its HOME and TMPDIR), removed afterwards;
  * an environment built from scratch (PATH, HOME, TMPDIR, LANG): nothing of ours is inherited;
  * limits: wall clock (``timeout_s``), CPU seconds, address space (RLIMIT_AS), file size (which also
    bounds what it can print: stdout and stderr go to files), open files, processes, no core dumps;
  * its own network namespace (no interface is up, not even loopback) and its own PID namespace, so it
    cannot reach the network or see our processes, and everything it forks dies with it;
  * its own mount namespace with empty private /tmp, /var/tmp, /dev/shm (its working directory is
    bound back in) and a /proc of its PID namespace;
  * when we run as root: a separate unprivileged uid (a fresh random one per program, else 65534), so
    RLIMIT_NPROC binds (it never binds root), it cannot signal us or read our /proc/PID/environ, and
    it can write only where any user may. Not as root: an unprivileged user namespace gives it the
    namespaces above where the kernel allows them; it keeps our file permissions.

A small launcher (``_LAUNCHER`` below, run as us by the same interpreter) applies the namespaces, limits and
uid, then execs the program's interpreter. Isolation the platform refuses is probed once and dropped
(see ``isolation()``); the limits always apply. This is a guard against accidents and hostile
programs of the kinds tested in tests/test_sandbox.py, not a hardened security boundary: run untrusted
code on a machine you can afford to lose, as the Codex paper advises.

Statuses: ``passed`` (exit 0), ``failed`` (non-zero exit), ``timed_out`` (wall clock or CPU limit),
``crashed`` (killed by any other signal, e.g. SIGXFSZ for printing too much, SIGSEGV).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from ..types import UsageError

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
SCRATCH = ("/tmp", "/var/tmp", "/dev/shm")  # world-writable folders a program gets private copies of
NOBODY = 65534
STATUSES = ("passed", "failed", "timed_out", "crashed")
SETUP_FAILED = 125  # launcher exit status when it could not set the sandbox up (with a nonce on stderr)

# Runs as us (root or not), under the program's interpreter; the JSON job arrives on the pipe argv[1]. With a PID
# namespace it forks an init process (PID 1, set to die with the launcher) which forks the program;
# when the program ends or the launcher is killed, init exits and the kernel kills everything left in
# the namespace.
_LAUNCHER = r"""
import ctypes, json, os, resource, signal, sys
with os.fdopen(int(sys.argv[1]), "rb") as handle:  # a pipe, not argv: the program can read our argv
    job = json.loads(handle.read())
def fail(what):
    sys.stderr.write(job["nonce"] + " " + what + "\n"); sys.stderr.flush(); os._exit(125)
def relay(status):  # end this process the way the program ended
    if os.WIFSIGNALED(status):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status))
def run_program():
    try:
        if job["uid"] is not None:
            os.setgroups([]); os.setgid(job["gid"]); os.setuid(job["uid"])
        if not job["fork"]:
            libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG again: the uid change cleared it
        for name, value in job["rlimits"].items():
            which = getattr(resource, name)
            hard = resource.getrlimit(which)[1]
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(which, (value, value))
        os.chdir(job["cwd"])
        os.execve(job["argv"][0], job["argv"], job["env"])
    except (OSError, ValueError) as exc:
        fail(type(exc).__name__ + ": " + str(exc))
def private_scratch():  # fresh tmpfs over /tmp & co. in our mount namespace; the work dir is bound back
    MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 4096, 16384, 262144
    def mount(source, target, fstype, flags, data):
        if libc.mount(source, target.encode(), fstype, flags, data) != 0:
            fail("mount " + target + ": " + os.strerror(ctypes.get_errno()))
    work = os.open(job["cwd"], os.O_RDONLY | os.O_DIRECTORY)
    mount(b"none", "/", None, MS_REC | MS_PRIVATE, None)  # nothing we mount reaches the host
    for folder in job["scratch"]:
        mount(b"tmpfs", folder, b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=1777,size=64m")
    os.makedirs(job["cwd"], exist_ok=True)
    mount(("/proc/self/fd/%d" % work).encode(), job["cwd"], None, MS_BIND, None)
    os.close(work)
libc = ctypes.CDLL(None, use_errno=True)
libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: if our caller dies, so do we (and all we started)
if os.getppid() != job["caller"]:
    os._exit(125)  # it died before the line above
if job["unshare"] and libc.unshare(job["unshare"]) != 0:
    fail("unshare: " + os.strerror(ctypes.get_errno()))
if job["unshare"] & 0x10000000:  # CLONE_NEWUSER (not root): map our own uid/gid, or files cannot be made
    uid, gid = os.getuid(), os.getgid()
    for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
        with open("/proc/self/" + name, "w") as handle:
            handle.write(text)
if job["unshare"] & 0x00020000:  # CLONE_NEWNS
    try:
        private_scratch()
    except OSError as exc:
        fail("private /tmp: " + str(exc))
if not job["fork"]:
    run_program()
read_end, write_end = os.pipe()
init = os.fork()  # PID 1 of the new namespace: when it dies, every process in it dies
if init == 0:
    os.close(read_end)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the launcher
    if job["unshare"] & 0x00020000:  # a /proc of this PID namespace: our processes are not in it
        libc.mount(b"proc", b"/proc", b"proc", 2 | 4 | 8, None)  # best effort: the uid change also guards
    program = os.fork()  # the program runs as PID 2, so signals reach it as usual
    if program == 0:
        os.close(write_end)
        run_program()
    _, status = os.waitpid(program, 0)
    os.write(write_end, str(status).encode())
    os._exit(0)
os.close(write_end)
os.waitpid(init, 0)
report = os.read(read_end, 64)
if not report:
    fail("the namespace's init process died")
relay(int(report))
"""


class SandboxError(UsageError):
    """The sandbox itself cannot run programs here (not the program's fault); the message says why."""


@dataclass(frozen=True)
class Limits:
    timeout_s: float = 10.0  # wall clock
    memory_bytes: int = 2 << 30  # RLIMIT_AS: address space, which is more than resident memory
    file_size_bytes: int = 16 << 20  # any file it writes, and its stdout/stderr
    max_processes: int = 64  # RLIMIT_NPROC: per uid, hence the fresh uid per program
    max_open_files: int = 256
    output_chars: int = 64 << 10  # how much of stdout/stderr is kept in the Outcome

    def rlimits(self) -> dict[str, int]:
        return {"RLIMIT_CPU": int(self.timeout_s) + 1, "RLIMIT_AS": self.memory_bytes,
                "RLIMIT_FSIZE": self.file_size_bytes, "RLIMIT_NPROC": self.max_processes,
                "RLIMIT_NOFILE": self.max_open_files, "RLIMIT_CORE": 0}


@dataclass
class Outcome:
    status: str  # one of STATUSES
    returncode: int | None  # negative: killed by that signal
    stdout: str
    stderr: str
    duration_s: float
    detail: str = ""  # why it did not pass, in a few words

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@dataclass(frozen=True)
class Isolation:
    """What this platform lets the sandbox do; found once per process by ``isolation()``."""

    python: str  # interpreter the program runs under
    uid: int | None  # None: programs run as our own uid
    fresh_uid: bool  # a new random uid per program (else every program shares ``uid``)
    unshare: int  # namespace flags
    network_isolated: bool
    pid_namespace: bool
    private_scratch: bool = False  # /tmp, /var/tmp, /dev/shm are fresh tmpfs of its own

    def describe(self) -> str:
        user = "own uid" if self.uid is None else ("fresh uid per program" if self.fresh_uid else f"uid {self.uid}")
        network = "isolated" if self.network_isolated else "NOT isolated"
        return (f"python={self.python}, user={user}, network={network}, "
                f"pid namespace={'yes' if self.pid_namespace else 'no'}, "
                f"private /tmp={'yes' if self.private_scratch else 'no'}")


def _launch(job: dict, timeout_s: float, stdin_path: str | None, out_path: str,
            err_path: str) -> tuple[int | None, bool, float]:
    """Run the launcher; return (returncode, timed_out, seconds). Kills everything on timeout."""
    stdin = open(stdin_path, "rb") if stdin_path else subprocess.DEVNULL
    job_read, job_write = os.pipe()
    with os.fdopen(job_write, "wb") as handle:  # a few hundred bytes: fits the pipe's buffer
        handle.write(json.dumps(job).encode())
    started = time.perf_counter()
    try:
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            proc = subprocess.Popen([job["argv"][0], "-I", "-S", "-c", _LAUNCHER, str(job_read)], stdin=stdin,
                                    stdout=out, stderr=err, env={}, close_fds=True, pass_fds=(job_read,),
                                    start_new_session=True)
            os.close(job_read)
            job_read = None
            try:
                return proc.wait(timeout=timeout_s), False, time.perf_counter() - started
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid)
                proc.wait()
                return proc.returncode, True, time.perf_counter() - started
            finally:
                if proc.returncode is None:
                    _kill_group(proc.pid)
                    proc.wait()
                if not job["fork"]:
                    _kill_group(proc.pid)  # without a PID namespace, leftovers in the group die here
    finally:
        if job_read is not None:
            os.close(job_read)
        if stdin_path:
            stdin.close()


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _job(iso: Isolation, limits: Limits, cwd: str, argv: list[str], nonce: str, uid: int | None) -> dict:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": cwd, "TMPDIR": cwd, "LANG": "C.UTF-8",
           "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    return {"unshare": iso.unshare, "fork": iso.pid_namespace, "uid": uid, "gid": uid, "rlimits": limits.rlimits(),
            "cwd": cwd, "argv": argv, "env": env, "nonce": nonce, "caller": os.getpid(),
            "scratch": [d for d in SCRATCH if os.path.isdir(d) and not os.path.islink(d)]}


def _probe(python: str, uid: int | None, unshare: int) -> bool:
    """Can a trivial program run with these settings? (stdlib import, a child process)."""
    iso = Isolation(python, uid, False, unshare, False, bool(unshare & CLONE_NEWPID))
    with tempfile.TemporaryDirectory(prefix="sbd_probe_") as tmp:
        if uid is not None:
            os.chown(tmp, uid, uid)
        code = "import json, math, subprocess, sys; subprocess.run([sys.executable, '-c', 'pass'], check=True)"
        argv = [python, "-I", "-c", code]
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        job = _job(iso, Limits(), tmp, argv, "probe", uid)
        job["rlimits"] = {}
        try:
            code, timed_out, _ = _launch(job, 20, None, out, err)
        except OSError:
            return False
        return code == 0 and not timed_out


def _python_candidates() -> list[str]:
    explicit = os.environ.get("SBD_SANDBOX_PYTHON")
    if explicit:
        return [explicit]
    found = [sys.executable] + [p for p in ("/usr/bin/python3", "/usr/local/bin/python3", shutil.which("python3")) if p]
    return list(dict.fromkeys(p for p in found if os.path.exists(p)))


@lru_cache(maxsize=1)
def isolation() -> Isolation:
    """Probe (once) the strongest settings this platform allows, weakening step by step."""
    if not sys.platform.startswith("linux"):
        # no namespaces, no uid drop; limits through the launcher still apply on other POSIX systems
        return Isolation(sys.executable, None, False, 0, False, False)
    root = os.geteuid() == 0
    fresh = 1_000_000_000 + secrets.randbelow(1_000_000_000)
    uids = [fresh, NOBODY] if root else [None]
    base = 0 if root else CLONE_NEWUSER  # unprivileged namespaces need a user namespace of their own
    flag_sets = [base | CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWPID, base | CLONE_NEWNET | CLONE_NEWPID,
                 base | CLONE_NEWNET, 0]
    tried = []
    for python in _python_candidates():
        for uid in uids:
            for flags in flag_sets:
                if _probe(python, uid, flags):
                    return Isolation(python, uid, uid == fresh, flags, bool(flags & CLONE_NEWNET),
                                     bool(flags & CLONE_NEWPID), bool(flags & CLONE_NEWNS))
                tried.append(python)
    raise SandboxError(
        f"cannot run a Python program in the sandbox here (tried {', '.join(dict.fromkeys(tried))}"
        f"{' as uid ' + str(fresh) + ' and ' + str(NOBODY) if root else ''}): set SBD_SANDBOX_PYTHON to an "
        "interpreter that every user can execute (e.g. /usr/bin/python3), or run as a non-root user")


def run_python(source: str, stdin: str | None = None, limits: Limits = Limits()) -> Outcome:
    """Run ``source`` as a Python program (``python -I main.py``) and return what happened."""
    iso = isolation()
    uid = 1_000_000_000 + secrets.randbelow(1_000_000_000) if iso.fresh_uid else iso.uid
    nonce = secrets.token_hex(8)
    with tempfile.TemporaryDirectory(prefix="sbd_io_") as io_dir, tempfile.TemporaryDirectory(prefix="sbd_run_") as cwd:
        program = os.path.join(cwd, "main.py")
        Path(program).write_text(source, encoding="utf-8")
        stdin_path = None
        if stdin is not None:
            stdin_path = os.path.join(io_dir, "stdin")
            Path(stdin_path).write_text(stdin, encoding="utf-8")
        if uid is not None:
            os.chown(cwd, uid, uid)
            os.chown(program, uid, uid)
        out_path, err_path = os.path.join(io_dir, "stdout"), os.path.join(io_dir, "stderr")
        job = _job(iso, limits, cwd, [iso.python, "-I", program], nonce, uid)
        code, timed_out, seconds = _launch(job, limits.timeout_s, stdin_path, out_path, err_path)
        stdout, stderr = _read_clipped(out_path, limits.output_chars), _read_clipped(err_path, limits.output_chars)
    if code == SETUP_FAILED and nonce in stderr:
        raise SandboxError(f"the sandbox could not start a program: {stderr.split(nonce, 1)[1].strip()}")
    return _outcome(code, timed_out, stdout, stderr, seconds)


def _outcome(code: int | None, timed_out: bool, stdout: str, stderr: str, seconds: float) -> Outcome:
    if timed_out:
        return Outcome("timed_out", code, stdout, stderr, seconds, "wall-clock limit")
    if code == 0:
        return Outcome("passed", 0, stdout, stderr, seconds)
    if code is not None and code < 0:
        sig = -code
        if sig == signal.SIGXCPU:
            return Outcome("timed_out", code, stdout, stderr, seconds, "CPU-time limit")
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else f"signal {sig}"
        why = {"SIGXFSZ": "file-size/output limit", "SIGKILL": "killed",
               "SIGSEGV": "segmentation fault"}.get(name, name)
        return Outcome("crashed", code, stdout, stderr, seconds, f"{why} ({name})")
    last = stderr.strip().splitlines()[-1] if stderr.strip() else f"exit status {code}"
    return Outcome("failed", code, stdout, stderr, seconds, last[:200])


def _read_clipped(path: str, limit: int) -> str:
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    text = data[:limit].decode("utf-8", errors="replace")
    return text + ("\n[... output clipped]" if len(data) > limit else "")


def run_many(jobs: Iterable[tuple[str, str | None]], limits: Limits = Limits(),
             workers: int | None = None) -> list[Outcome]:
    """Run (source, stdin) jobs in parallel (threads waiting on processes); results in input order."""
    jobs = list(jobs)
    isolation()  # probe once before the threads start
    workers = workers or max(1, min(len(jobs), os.cpu_count() or 1))
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda job: run_python(job[0], job[1], limits), jobs))
