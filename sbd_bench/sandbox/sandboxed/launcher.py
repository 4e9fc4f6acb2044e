"""The sandbox's launcher. jobs.py compiles it once per interpreter and starts it as ``PYTHON -s -S -c
<a bootstrap> CODE_FD JOB_FD`` (the bootstrap runs the code in CODE_FD), as our own user, under the
sandbox's interpreter; it is never imported. It reads the job (marshal) from the file
JOB_FD and starts one process per side of the job: a program to run (``program``), or a judged
session's ``judge`` and ``candidate``, each alone in its own namespaces. For a session it first runs
proxy.py's code (both sides inherit the result). For each side:

  side root (forked from here): join the job's control groups (its memory and process budget), make
      itself the OOM killer's first choice, unshare the namespaces; build the file system view (a tmpfs
      with a size quota as the root, the interpreter, its shared libraries and the standard library
      bound in read only, site-packages masked, a few device nodes, empty /tmp and working directory)
      or, without a view, make the host's file system read only and mount one private tmpfs for /tmp
      & co. and the working directory; then fork
  init (PID 1 of the side's PID namespace, dies with the side root): mount a /proc of that namespace,
      pivot into the view (the host's file system is detached, not hidden), fork the program and report
      how it ended on the side's exit pipe
  program: take its file descriptors, drop to the side's uid (or drop every capability in a user
      namespace), no new privileges, the limits, the seccomp filter (no new user namespaces: see
      seccomp.py), then run: exec the interpreter on main.py, or serve the candidate's program, or run
      the judge (proxy.py).

Without a PID namespace the side root is the program. A side that cannot be set up says why on its
setup pipe before anything untrusted runs and exits 125; the pipe is closed, empty, when the side starts
its payload, so nothing the payload does can pass for a setup failure. When the job's main side (the
judge, or the program) has ended, every other side is killed. Last, the launcher writes to the status
file (marshal): per side, the setup error or "", and the wait status of its program (None: killed by us,
still running). Everything dies with the launcher (parent-death signals all the way down).

Each session pays for what this file imports before it forks (and its sides for their imports): hence
marshal rather than json (whose import pulls in re), and _signal rather than signal (enum).
"""
import _signal as signal
import ctypes
import fcntl
import marshal
import os
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 262144
MNT_DETACH = 2
CLONE_NEWNS, CLONE_NEWUSER = 0x00020000, 0x10000000
PR_SET_PDEATHSIG, PR_SET_DUMPABLE, PR_SET_SECCOMP, PR_SET_NO_NEW_PRIVS = 1, 4, 22, 38
SECCOMP_MODE_FILTER = 2
# mount flags a bind mount keeps from its source in a user namespace (statvfs's ST_* -> MS_*)
LOCKABLE = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC), (os.ST_NOATIME, 1024),
            (os.ST_NODIRATIME, 2048), (os.ST_RELATIME, 1 << 21))
SETUP_FAILED = 125
# the fds a side's program holds when its payload starts: stdin, stdout, stderr, then these
PEER_IN, PEER_OUT, SOURCE, REPORT = 3, 4, 5, 6

libc = ctypes.CDLL(None, use_errno=True)


class SetupError(Exception):
    pass


def check(result, what):
    if result != 0:
        raise SetupError(f"{what}: {os.strerror(ctypes.get_errno())}")


def mount(source, target, fstype, flags, data=None):
    check(libc.mount(source and source.encode(), target.encode(), fstype and fstype.encode(), flags,
                     data and data.encode()), f"mount {target}")


def bind_read_only(source, target, locked):
    mount(source, target, None, MS_BIND)
    # the source's nosuid/nodev/noexec/atime flags are locked in a user namespace: keep them
    mount(None, target, None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | locked)


def build_view(side, view):
    """The side's whole file system: a size-limited tmpfs at view["mountpoint"] holding mount points
    for what the plan binds in; init pivots into it."""
    root = view["mountpoint"]
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV,
          f"size={side['disk_bytes']},nr_inodes={view['inodes']},mode=755")
    for op in view["plan"]:
        kind, path = op[0], root + op[1]
        if kind == "dir":
            os.mkdir(path)
            os.chmod(path, op[2])
        elif kind == "link":
            os.symlink(op[2], path)
        elif kind in ("file", "device"):
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o444))
            if kind == "device":  # /dev/null & co.: written to, so not read only
                mount(op[2], path, None, MS_BIND)
            else:
                bind_read_only(op[2], path, op[3])
        elif kind == "tree":
            os.mkdir(path)
            bind_read_only(op[2], path, op[3])
        elif kind == "mask":  # an empty, read-only directory over it (site-packages)
            mount("tmpfs", path, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k,nr_inodes=8,mode=555")
    for folder in ("/tmp", "/var", "/var/tmp", "/dev/shm"):
        if not os.path.isdir(root + folder):
            os.mkdir(root + folder)
        os.chmod(root + folder, 0o1777 if folder != "/var" else 0o755)
    os.mkdir(root + "/proc")
    for folder in ("/sandbox", side["cwd"]):
        os.makedirs(root + folder, exist_ok=True)
    os.chmod(root + side["cwd"], 0o700)
    if side["uid"] is not None:
        os.chown(root + side["cwd"], side["uid"], side["gid"])


def read_only_host():
    """Every mount of the host's file system read only, in our mount namespace: nothing the program
    writes outside the tmpfs mounted next reaches the host or outlives the program."""
    with open("/proc/self/mountinfo", "rb") as handle:
        points = [line.split()[4].decode("utf-8", "surrogateescape") for line in handle]
    for point in dict.fromkeys(points):
        point = "".join(chr(int(p[:3], 8)) + p[3:] if i else p for i, p in enumerate(point.split("\\")))
        try:
            kept = os.statvfs(point).f_flag
        except OSError:
            continue  # hidden under another mount: unreachable anyway
        locked = 0
        for st, ms in LOCKABLE:
            if kept & st:
                locked |= ms
        mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY | locked)


def private_scratch(side):
    """No view: the host's file system read only; one tmpfs under the disk quota, mounted first over
    the (empty, host) working directory, then lent out: its "tmp", "var-tmp" and "shm" folders to
    /tmp, /var/tmp and /dev/shm, its "work" folder to the working directory itself."""
    read_only_host()
    cwd, uid = side["cwd"], side["uid"]
    mount("tmpfs", cwd, "tmpfs", MS_NOSUID | MS_NODEV, f"mode=755,size={side['disk_bytes']}")
    for name, mode in (("work", 0o700), ("tmp", 0o1777), ("var-tmp", 0o1777), ("shm", 0o1777)):
        os.mkdir(f"{cwd}/{name}")
        os.chmod(f"{cwd}/{name}", mode)
    if uid is not None:
        os.chown(f"{cwd}/work", uid, side["gid"])
    quota = os.open(cwd, os.O_RDONLY | os.O_DIRECTORY)  # reachable by fd once /tmp hides the path
    for folder in side["scratch"]:
        name = {"/tmp": "tmp", "/var/tmp": "var-tmp", "/dev/shm": "shm"}.get(folder, "tmp")
        mount(f"/proc/self/fd/{quota}/{name}", folder, None, MS_BIND)
    os.makedirs(cwd, exist_ok=True)  # under /tmp (the usual place): made anew in the tmpfs
    mount(f"/proc/self/fd/{quota}/work", cwd, None, MS_BIND)
    os.close(quota)


def join_groups(paths):
    """Into the job's control groups (its memory and process budget), before anything else happens."""
    pid = str(os.getpid()).encode()
    for path in paths:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, pid)
        finally:
            os.close(fd)
    libc.prctl(PR_SET_DUMPABLE, 1)  # else /proc/self is root's, not ours to write (not root)
    try:  # the kernel's OOM killer takes our processes before any other (the scorer above all)
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
        os.write(fd, b"1000")
        os.close(fd)
    except OSError:
        pass
    libc.prctl(PR_SET_DUMPABLE, 0)


def install_filter(program):
    """The seccomp filter (built by seccomp.py): it holds for this process and all it starts."""
    code = ctypes.create_string_buffer(program, len(program))

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    check(libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(Program(len(program) // 8, ctypes.addressof(code))),
                     0, 0), "seccomp filter")


def enter_view(view):
    """Make the view the root: pivot_root(".", ".") stacks the old root on the new one; detaching it
    leaves the host's file system unreachable from here on."""
    os.chdir(view["mountpoint"])
    pivot = getattr(libc, "pivot_root", None)
    result = pivot(b".", b".") if pivot is not None else libc.syscall(view["pivot_root_syscall"], b".", b".")
    check(result, "pivot_root")
    check(libc.umount2(b".", MNT_DETACH), "detach the host's root")
    os.chdir("/")


def arrange_fds(wanted):
    """Make fd i a copy of wanted[i] (None: /dev/null for 0, else closed); close every other fd."""
    high = [None if fd is None else fcntl.fcntl(fd, fcntl.F_DUPFD, 64 + len(wanted)) for fd in wanted]
    for target, fd in enumerate(high):
        if fd is not None:
            os.dup2(fd, target)
        elif target == 0:
            null = os.open(os.devnull, os.O_RDONLY)
            if null != 0:
                os.dup2(null, 0)
                os.close(null)
    for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
        if fd >= len(wanted) or high[fd] is None and fd > 0:
            try:
                os.close(fd)
            except OSError:
                pass


def drop_privileges(side):
    if side["uid"] is not None:
        os.setgroups([])
        os.setgid(side["gid"])
        os.setuid(side["uid"])  # from root to another uid: every capability goes
    elif side["unshare"] & CLONE_NEWUSER:  # same uid, but all capabilities in the user namespace: drop them
        class Header(ctypes.Structure):
            _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

        class Data(ctypes.Structure):
            _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                        ("inheritable", ctypes.c_uint32)]
        check(libc.capset(ctypes.byref(Header(0x20080522, 0)), (Data * 2)()), "drop capabilities")
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no new privileges")
    if not side["fork"]:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # again: the uid change cleared it
    for name, value in side["rlimits"].items():
        which = getattr(resource, name)
        hard = resource.getrlimit(which)[1]
        value = value if hard == resource.RLIM_INFINITY else min(value, hard)
        resource.setrlimit(which, (value, value))
    if side["seccomp"]:
        install_filter(side["seccomp"])


def run_program(job, side, fds, setup_w):
    """Become the side's program. Never returns."""
    setup = setup_w
    try:
        arrange_fds([fds.get("stdin"), fds["stdout"], fds["stderr"], fds.get("peer_in"), fds.get("peer_out"),
                     fds["source"], fds.get("report"), setup_w])
        setup = 7
        drop_privileges(side)
        # the judge stays undumpable (as we made every side): no process of its uid may trace it, read its
        # memory or open its fds; the candidate's program is an ordinary process again
        libc.prctl(PR_SET_DUMPABLE, int(side["role"] == "candidate"))
        os.chdir(side["cwd"])
        with os.fdopen(SOURCE, "rb") as handle:
            source = handle.read().decode("utf-8")
        os.environ.clear()
        os.environ.update(side["env"])
        sys.argv[:] = ["main.py"]
        if side["role"] == "program":
            path = os.path.join(side["cwd"], "main.py")
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(source)
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # as a fresh process has them
                signal.signal(sig, signal.SIG_DFL)
            os.set_inheritable(setup, False)  # a successful exec closes it
            os.execve(side["argv"][0], side["argv"] + [path], side["env"])
    except (OSError, ValueError, SetupError) as exc:
        os.write(setup, f"{type(exc).__name__}: {exc}".encode())
        os._exit(SETUP_FAILED)
    os.close(setup)  # closed and empty: set up. What runs from here cannot say otherwise
    runtime = job["runtime"]
    del job, fds
    code = 0
    try:
        if side["role"] == "candidate":
            runtime["serve_candidate"](source, PEER_IN, PEER_OUT)
        else:
            runtime["run_judge"](source, PEER_IN, PEER_OUT, REPORT)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        code = 1
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


def start_side(job, side, fds, setup, exit_pipe):
    """Fork the side's root; returns its pid."""
    pid = os.fork()
    if pid:
        return pid
    setup_w, exit_w = setup[1], exit_pipe[1]
    try:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # die with the launcher
        if os.getppid() != job["launcher"]:
            os._exit(SETUP_FAILED)
        join_groups(job["groups"])
        keep = {fd for fd in fds.values() if fd is not None} | {setup_w, exit_w}
        for fd in [int(name) for name in os.listdir("/proc/self/fd")]:
            if fd > 2 and fd not in keep:  # the other side's files above all
                try:
                    os.close(fd)
                except OSError:
                    pass
        flags, view = side["unshare"], side.get("view")
        if flags:
            check(libc.unshare(flags), "unshare")
        if flags & CLONE_NEWUSER:  # not root: map our own uid/gid, or files cannot be made
            libc.prctl(PR_SET_DUMPABLE, 1)  # else /proc/self/uid_map is root's, not ours to write
            uid, gid = os.getuid(), os.getgid()
            for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
                with open("/proc/self/" + name, "w") as handle:
                    handle.write(text)
            libc.prctl(PR_SET_DUMPABLE, 0)  # init and the judge inherit it: the candidate may not trace them
        if flags & CLONE_NEWNS:
            mount("none", "/", None, MS_REC | MS_PRIVATE)  # nothing we mount reaches the host
            if view:
                build_view(side, view)
            else:
                private_scratch(side)
        if not side["fork"]:
            os.close(exit_w)
            run_program(job, side, fds, setup_w)
        init = os.fork()  # PID 1 of the side's namespace: when it dies, every process in it dies
        if init:
            os.close(setup_w)
            os.close(exit_w)
            os.waitpid(init, 0)
            os._exit(0)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # die with the side root
        if flags & CLONE_NEWNS:  # a /proc of this PID namespace: our processes are not in it
            try:
                mount("proc", (view["mountpoint"] if view else "") + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
            except SetupError:
                if view:
                    raise  # without a view, best effort: the uid change guards /proc too
        if view:
            enter_view(view)
        program = os.fork()
        if program == 0:  # PID 2: signals reach it as usual
            os.close(exit_w)
            run_program(job, side, fds, setup_w)
        os.close(setup_w)
        _, status = os.waitpid(program, 0)
        os.write(exit_w, str(status).encode())
        os._exit(0)
    except (OSError, SetupError) as exc:
        os.write(setup_w, f"{type(exc).__name__}: {exc}".encode())
        os._exit(SETUP_FAILED)


def read_all(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 4096)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def main():
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)  # if our caller dies, so do we (and all we started)
    libc.prctl(PR_SET_DUMPABLE, 0)  # no process of our uid may trace us or read our memory (the sides inherit it)
    with os.fdopen(int(sys.argv[1]), "rb") as handle:
        job = marshal.loads(handle.read())
    if os.getppid() != job["caller"]:
        os._exit(SETUP_FAILED)  # it died before the line above
    job["launcher"] = os.getpid()
    peers = {}
    if len(job["sides"]) == 2:  # once here rather than in each side
        runtime = {"__name__": "sbd_proxy"}
        exec(marshal.loads(job["runtime"]), runtime)  # compiled by jobs.py, once per interpreter
        job["runtime"] = runtime
        import site  # what `python -I` gives a program: exit(), quit(), help() (no sys.path changes)
        site.setquit()
        site.setcopyright()
        site.sethelper()
        for name in job["preload"]:  # modules both sides would import (HumanEval's prompts: typing): once here
            __import__(name)
        to_candidate, to_judge = os.pipe(), os.pipe()  # judge -> candidate, candidate -> judge
        peers = {"judge": {"peer_in": to_judge[0], "peer_out": to_candidate[1]},
                 "candidate": {"peer_in": to_candidate[0], "peer_out": to_judge[1]}}
    started = []  # (pid, setup read end, exit read end) per side
    for side in job["sides"]:
        setup, exit_pipe = os.pipe(), os.pipe()
        pid = start_side(job, side, {**side["fds"], **peers.get(side["role"], {})}, setup, exit_pipe)
        os.close(setup[1])
        os.close(exit_pipe[1])
        started.append((pid, setup[0], exit_pipe[0]))
    for ends in peers.values():
        for fd in ends.values():
            os.close(fd)
    report = [{"setup": read_all(setup_r).decode("utf-8", "replace"), "status": None} for _, setup_r, _ in started]
    waited = {}
    if not any(entry["setup"] for entry in report):
        main_side = next(i for i, side in enumerate(job["sides"]) if side["role"] in ("judge", "program"))
        waited[main_side] = os.waitpid(started[main_side][0], 0)[1]
    for i, ((pid, _, exit_r), side, entry) in enumerate(zip(started, job["sides"], report)):
        if side["fork"]:  # init said how the program ended, if it has
            os.set_blocking(exit_r, False)
            try:
                said = os.read(exit_r, 64)
            except BlockingIOError:
                said = b""
            entry["status"] = int(said) if said else None
        elif not entry["setup"]:  # the side's root was the program
            if i not in waited:
                finished, status = os.waitpid(pid, os.WNOHANG)
                if finished:
                    waited[i] = status
            entry["status"] = waited.get(i)
        if i not in waited:
            try:
                os.kill(pid, signal.SIGKILL)  # still running when the main side ended: it has had its turn
                os.waitpid(pid, 0)
            except (ProcessLookupError, ChildProcessError):
                pass
    os.write(job["status_fd"], marshal.dumps(report))
    os._exit(0)  # no interpreter shutdown: it would cost more than all of the above


if __name__ == "__main__":
    main()
