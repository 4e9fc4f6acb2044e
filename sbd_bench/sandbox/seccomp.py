"""The system calls a sandboxed program may not make, as a seccomp filter (classic BPF) that the
launcher installs in each of its processes just before the program runs; it holds for everything the
program starts.

Refused in every mode: new user namespaces (``unshare`` and ``clone`` with CLONE_NEWUSER fail with
EPERM; ``clone3``, whose flags a filter cannot read, fails with ENOSYS, on which the C library falls
back to ``clone``). Inside a user namespace of its own a program could mount a tmpfs past the
sandbox's quota, or anything else it likes; the sandbox never needs one below the launcher's. A filter
rather than ``max_user_namespaces`` = 0 in a user namespace of the sandbox's: started as root, the
sandbox has no user namespace of its own to set that in, and the filter binds alike in every mode.

Refused only where no control group bounds the job's memory (``refuse_shared_memory``): ``memfd_create``
and ``shmget``, whose pages outlive every mapping and so escape RLIMIT_AS; with a group they count
against its memory like everything else.

System calls of another ABI (i386 or x32 on x86-64) are refused: their numbers would slip past the
filter. Architectures whose numbers are not written here get no filter (``program`` returns None),
and the sandbox says so.
"""
from __future__ import annotations

import errno
import os
import struct
import subprocess
import sys
from functools import lru_cache

CLONE_NEWUSER = 0x10000000
# AUDIT_ARCH_* and the system call numbers: clone, clone3, unshare, memfd_create, shmget
_ARCHES = {
    "x86_64": (0xC000003E, {"clone": 56, "clone3": 435, "unshare": 272, "memfd_create": 319, "shmget": 29}),
    "aarch64": (0xC00000B7, {"clone": 220, "clone3": 435, "unshare": 97, "memfd_create": 279, "shmget": 194}),
}
_X32_BIT = 0x40000000
# classic BPF opcodes and seccomp's return values
_LOAD, _JEQ, _JGE, _JSET, _RET = 0x20, 0x15, 0x35, 0x45, 0x06
_ALLOW, _ERRNO = 0x7FFF0000, 0x00050000
_NR, _ARCH, _ARG0 = 0, 4, 16  # offsets in struct seccomp_data (arg0's low 32 bits: little-endian)


@lru_cache(maxsize=4)
def program(refuse_shared_memory: bool, machine: str | None = None) -> bytes | None:
    """The filter (struct sock_filter[]) for this machine's architecture, or None if it is not known."""
    machine = machine or os.uname().machine
    if machine not in _ARCHES:
        return None
    audit_arch, nr = _ARCHES[machine]
    # (opcode, k, label to jump to if true, if false); no label: the next instruction
    code = [(_LOAD, _ARCH, None, None), (_JEQ, audit_arch, None, "enosys"), (_LOAD, _NR, None, None)]
    if machine == "x86_64":
        code.append((_JGE, _X32_BIT, "enosys", None))
    code.append((_JEQ, nr["clone3"], "enosys", None))
    code += [(_JEQ, nr[name], "flags", None) for name in ("clone", "unshare")]
    code += [(_JEQ, nr[name], "eperm", None) for name in (("memfd_create", "shmget") if refuse_shared_memory else ())]
    code.append((_RET, _ALLOW, None, None))
    labels = {"flags": len(code)}
    code += [(_LOAD, _ARG0, None, None), (_JSET, CLONE_NEWUSER, "eperm", None), (_RET, _ALLOW, None, None)]
    labels["eperm"] = len(code)
    code.append((_RET, _ERRNO | errno.EPERM, None, None))
    labels["enosys"] = len(code)
    code.append((_RET, _ERRNO | errno.ENOSYS, None, None))
    return b"".join(struct.pack("=HBBI", op, labels[yes] - at - 1 if yes else 0, labels[no] - at - 1 if no else 0, k)
                    for at, (op, k, yes, no) in enumerate(code))


# Run by the sandbox's interpreter once: is a filter accepted here, and does it refuse what it should
# while threads and child processes still start? (Exit 0 if so.)
_CHECK = r"""
import ctypes, errno, os, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
code = bytes.fromhex(sys.argv[1])
buf = ctypes.create_string_buffer(code, len(code))
class Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
assert libc.prctl(38, 1, 0, 0, 0) == 0
if libc.prctl(22, 2, ctypes.byref(Program(len(code) // 8, ctypes.addressof(buf))), 0, 0) != 0:
    sys.exit(3)
assert libc.unshare(0x10000000) != 0 and ctypes.get_errno() == errno.EPERM
thread = threading.Thread(target=lambda: None)
thread.start()
thread.join()
pid = os.fork()
if pid == 0:
    os._exit(0)
assert os.waitpid(pid, 0)[1] == 0
"""


@lru_cache(maxsize=8)
def works(python: str) -> bool:
    """Does this kernel take the filter, and do threads and processes still start under it?"""
    code = program(True)
    if code is None:
        return False
    try:
        done = subprocess.run([python, "-I", "-S", "-c", _CHECK, code.hex()], capture_output=True, timeout=60,
                              env={}, cwd="/")
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


if __name__ == "__main__":  # pragma: no cover - a manual look at the filter
    print(program(True).hex(), works(sys.executable))
