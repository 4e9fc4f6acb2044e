"""One memory and process budget for every process of a sandboxed job: a control group of our own,
made for the job and removed after it. Per-process limits (RLIMIT_AS, RLIMIT_NPROC) miss what a
program holds outside its address space or spreads over processes (tmpfs and memfd pages, SysV shared
memory, page cache, four processes of 1 GiB each); the group's memory counts all of it, for all the
job's processes together, and when they go past it the kernel's OOM killer kills one of them, never a
process outside the group (the scorer and the model it holds).

    >>> home = find_home()           # None where no group can be made (not root, no delegated subtree)
    >>> group = Group(home, memory_bytes=256 << 20, processes=70)
    >>> group.procs_files            # each of the job's processes writes its pid into these first
    >>> group.close()                # kills what is left in it, removes it; group.oom_kills() before that

Both hierarchies: cgroup v2 (``memory.max``, ``memory.swap.max`` = 0, ``memory.oom.group``,
``pids.max``), in the first group from ours upwards whose ``cgroup.subtree_control`` already hands
out memory and pids (or ``SBD_SANDBOX_CGROUP``, a delegated folder); cgroup v1 (``memory.limit_in_bytes``,
``memory.memsw.limit_in_bytes`` where swap is accounted, ``pids.max``) under the groups we run in. v1's
memory limit counts page cache and tmpfs/shmem pages (memfd and SysV shared memory are shmem) as v2's
does. Only groups this module made are touched: each is named ``sbd_bench-<our pid>-<n>``; stale ones
left by a process that died are removed when the next process looks for a home.
"""
from __future__ import annotations

import dataclasses
import errno
import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

PARENT_ENV = "SBD_SANDBOX_CGROUP"  # a cgroup v2 folder delegated to us, to make the job groups in
_NAME = re.compile(r"sbd_bench-(\d+)-\d+$")
_COUNTER = itertools.count()
_COUNTER_LOCK = threading.Lock()


class GroupError(OSError):
    """A group could not be made or given its limits."""


@dataclass(frozen=True)
class GroupHome:
    """Where this process makes its job groups: cgroup ``version`` 1 or 2, the parent folder per
    controller (v2: one folder for both), and whether swap is accounted (and so can be limited)."""

    version: int
    memory_parent: str
    pids_parent: str | None  # v1 without a pids hierarchy: memory only
    swap: bool  # swap is accounted here, and limited with the memory

    def describe(self) -> str:
        what = "memory" + (" incl. swap" if self.swap else "") + ("; processes" if self.pids_parent else "")
        return f"cgroup v{self.version} group per job ({what})"


def _unescape(field: str) -> str:
    """A path as /proc/self/mountinfo writes it (space, tab, newline and backslash octal-escaped)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _cgroup_mounts(mountinfo: str) -> list[tuple[str, str, str, set[str]]]:
    """(file system type, root within the hierarchy, mount point, super options) of each cgroup mount."""
    found = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) >= 5 and len(tail) >= 3 and tail[0] in ("cgroup", "cgroup2"):
            found.append((tail[0], _unescape(fields[3]), _unescape(fields[4]), set(tail[2].split(","))))
    return found


def _membership(text: str) -> dict[str, str]:
    """controller -> the path of the group we are in ("" for the v2 hierarchy), from /proc/self/cgroup."""
    groups = {}
    for line in text.splitlines():
        number, controllers, path = line.split(":", 2)
        for name in (controllers.split(",") if controllers else [""]):
            groups[name] = path
    return groups


def _folder(mount_root: str, mount_point: str, path: str) -> str | None:
    relative = os.path.relpath(path, mount_root)
    return None if relative.startswith("..") else os.path.normpath(os.path.join(mount_point, relative))


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return ""


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(value)


def _v2_parent(mount_root: str, mount_point: str, ours: str) -> str | None:
    """The first folder from our group upwards that hands memory and pids to the groups made in it."""
    explicit = os.environ.get(PARENT_ENV)
    if explicit:
        return explicit
    folder = _folder(mount_root, mount_point, ours)
    while folder and folder.startswith(mount_point):
        if {"memory", "pids"} <= set(_read(os.path.join(folder, "cgroup.subtree_control")).split()) \
                and os.access(folder, os.W_OK):
            return folder
        if folder == mount_point:
            break
        folder = os.path.dirname(folder)
    return None


def candidate_homes(mountinfo: str | None = None, membership: str | None = None) -> list[GroupHome]:
    """Where groups might be made, most wanted first (v2, then v1), from /proc/self/mountinfo and
    /proc/self/cgroup (or the texts given); not yet tried. ``swap`` is filled in by ``find_home``."""
    try:
        mounts = _cgroup_mounts(_read("/proc/self/mountinfo") if mountinfo is None else mountinfo)
        ours = _membership(_read("/proc/self/cgroup") if membership is None else membership)
    except ValueError:
        return []
    homes = []
    for kind, root, point, _ in mounts:
        if kind == "cgroup2" and "" in ours:
            parent = _v2_parent(root, point, ours[""])
            if parent:
                homes.append(GroupHome(2, parent, parent, False))
    v1 = {c: _folder(root, point, ours[c]) for kind, root, point, options in mounts if kind == "cgroup"
          for c in ("memory", "pids") if c in options and c in ours}
    if v1.get("memory") and os.access(v1["memory"], os.W_OK):
        pids = v1.get("pids") if v1.get("pids") and os.access(v1["pids"], os.W_OK) else None
        homes.append(GroupHome(1, v1["memory"], pids, False))
    return homes


# Run in a group to see that a process of ours can move itself in (the sandbox's processes do that
# first thing): cgroup v2 wants write access to the common ancestor's cgroup.procs for it.
_JOIN = "import os, sys\nfor path in sys.argv[1:]:\n    open(path, 'w').write(str(os.getpid()))\n"


def find_home() -> GroupHome | None:
    """The first place where a job group can be made, limited and joined here, or None."""
    for home in candidate_homes():
        remove_stale(home)
        try:
            group = Group(home, 64 << 20, 8)
        except GroupError:
            continue
        try:
            joined = subprocess.run([sys.executable, "-S", "-c", _JOIN, *group.procs_files], capture_output=True,
                                    timeout=30, env={}, cwd="/").returncode == 0
        except (OSError, subprocess.SubprocessError):
            joined = False
        finally:
            group.close()
        if joined:
            return dataclasses.replace(home, swap=group.swap_limited)
    return None


def remove_stale(home: GroupHome) -> None:
    """Remove the groups that processes of ours, now dead, made and left (a killed scorer)."""
    for parent in {home.memory_parent, home.pids_parent} - {None}:
        try:
            names = os.listdir(parent)
        except OSError:
            continue
        for name in names:
            match = _NAME.match(name)
            if match and not _alive(int(match.group(1))):
                folder = os.path.join(parent, name)
                _kill_members([folder])
                try:
                    os.rmdir(folder)
                except OSError:
                    pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _members(folders: list[str]) -> set[int]:
    return {int(pid) for folder in folders for pid in _read(os.path.join(folder, "cgroup.procs")).split()}


def _kill_members(folders: list[str]) -> None:
    for _ in range(200):  # a fork between reading and killing adds a member: read again
        members = _members(folders)
        if not members:
            return
        for pid in members:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.001)


class Group:
    """A job's group: made with its limits on construction, killed and removed by ``close()``."""

    def __init__(self, home: GroupHome, memory_bytes: int, processes: int):
        with _COUNTER_LOCK:
            number = next(_COUNTER)
        self.home, self.memory_bytes, self.closed = home, memory_bytes, False
        name = f"sbd_bench-{os.getpid()}-{number}"
        self.folders = list(dict.fromkeys(os.path.join(p, name) for p in (home.memory_parent, home.pids_parent) if p))
        self.memory = os.path.join(home.memory_parent, name)
        made = []
        try:
            for folder in self.folders:
                os.mkdir(folder)
                made.append(folder)
            # where swap is accounted, it is limited too: else pages swapped out would stretch the budget
            if home.version == 2:
                _write(os.path.join(self.memory, "memory.max"), str(memory_bytes))
                self.swap_limited = os.path.exists(os.path.join(self.memory, "memory.swap.max"))
                if self.swap_limited:
                    _write(os.path.join(self.memory, "memory.swap.max"), "0")
                try:  # an OOM kills the whole job (kernels since 4.19)
                    _write(os.path.join(self.memory, "memory.oom.group"), "1")
                except OSError:
                    pass
            else:
                _write(os.path.join(self.memory, "memory.limit_in_bytes"), str(memory_bytes))
                self.swap_limited = os.path.exists(os.path.join(self.memory, "memory.memsw.limit_in_bytes"))
                if self.swap_limited:  # memory and swap together: no more than memory alone (set after it)
                    _write(os.path.join(self.memory, "memory.memsw.limit_in_bytes"), str(memory_bytes))
            if home.pids_parent:
                _write(os.path.join(home.pids_parent, name, "pids.max"), str(processes))
        except OSError as exc:
            for folder in made:
                try:
                    os.rmdir(folder)
                except OSError:
                    pass
            raise GroupError(f"cannot make a control group under {home.memory_parent}: {exc}") from None

    @property
    def procs_files(self) -> list[str]:
        return [os.path.join(folder, "cgroup.procs") for folder in self.folders]

    def oom_kills(self) -> int:
        """How many of the job's processes the group's OOM killer has killed."""
        name = "memory.events" if self.home.version == 2 else "memory.oom_control"
        for line in _read(os.path.join(self.memory, name)).splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    def close(self) -> None:
        """Kill every process still in the group and remove it (once: later calls do nothing)."""
        if self.closed:
            return
        self.closed = True
        if self.home.version == 2 and os.path.exists(os.path.join(self.memory, "cgroup.kill")):
            try:
                _write(os.path.join(self.memory, "cgroup.kill"), "1")
            except OSError:
                pass
        _kill_members(self.folders)
        for folder in self.folders:
            for _ in range(500):  # a killed process leaves the group as it exits: a moment
                try:
                    os.rmdir(folder)
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        break
                    time.sleep(0.002)
