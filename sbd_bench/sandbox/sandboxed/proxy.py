"""Both ends of the pipe between a judge and the candidate program it scores. This file runs inside the
sandbox: the launcher (launcher.py) runs its text before it starts the two processes of a judged
session, so it imports nothing but the standard library, and little of that: its imports are paid for
in every session (it must run on the sandbox's interpreter, Python 3.8 or newer).

    candidate's process:  serve_candidate(source, 3, 4)       imports the program as module 'candidate'
    judge's process:      run_judge(test_source, 3, 4, 6)     runs the test program, writes the verdict

The judge's test program sees the candidate only through stubs: every name it uses that the candidate's
program defines (and that the test does not define itself, and that is no builtin) is bound before the
test runs, a function or class to a stub that forwards calls over the pipe, a standard-library module
to the judge's own import of it, a plain value to a copy of it; ``__candidate__.function(name, method)``
gives a stub explicitly. Only plain data crosses: None, bool, int, float, str, bytes, and lists, tuples,
dicts, sets and frozensets of these, at most MAX_DEPTH levels deep and MAX_MESSAGE bytes per message.
Anything else the candidate returns stays in its process; the judge holds an opaque handle that it can
pass back as an argument (a candidate class's instance, say) and nothing else: comparing it, testing
its truth, hashing or iterating it fails with the reason. An exception the candidate raises arrives as
the builtin exception of that name (never StopIteration, which would end the judge's loops early), else
as CandidateError. The verdict is the judge's own: the test program ran to its end without raising.

Wire format: each message is an 8-byte little-endian length and that many bytes of one value, a tag
byte and its payload: N None, T True, F False, i int64, I (size, bytes) a wider int, f float64,
s (size, UTF-8) str, b (size, bytes) bytes, l t S z d (count, items) list tuple set frozenset dict
(keys and values alternate), h (number) a handle passed back, H (number, str) a handle made; sizes and
counts are uint32, everything little-endian. The judge reads it with its own code into fresh objects of
these types only: nothing the candidate sends is run, or compared by the candidate's own methods.
"""
import builtins
import os
import struct
import sys

MAX_DEPTH = 100
MAX_MESSAGE = 32 << 20
PLAIN = "None, bool, int, float, str, bytes, and lists, tuples, dicts and sets of these"
_NOT_RAISED_AS_ITSELF = (StopIteration, StopAsyncIteration)  # would end the judge's loops, not fail them
_SIZE, _INT64, _DOUBLE, _LENGTH = struct.Struct("<I"), struct.Struct("<q"), struct.Struct("<d"), struct.Struct("<Q")
_CONTAINERS = {list: b"l", tuple: b"t", set: b"S", frozenset: b"z"}
_MAKERS = {b"l": list, b"t": tuple, b"S": set, b"z": frozenset}
_MODULE, _CODE = type(sys), type(compile("", "", "exec"))


class CandidateError(Exception):
    """The candidate did not answer with plain data: it raised, ended, or sent something else."""


class Handle:
    """An object the candidate returned that is not plain data; it stays in the candidate's process."""

    __slots__ = ("number", "kind")

    def __init__(self, number, kind):
        self.number, self.kind = number, kind

    def __repr__(self):
        return f"<the candidate's {self.kind} object>"

    def _refuse(self, *args, **kwargs):
        raise CandidateError(f"the candidate returned an object of type {self.kind}, not plain data ({PLAIN})")

    __eq__ = __ne__ = __lt__ = __le__ = __gt__ = __ge__ = __hash__ = __bool__ = __len__ = __iter__ = _refuse
    __contains__ = __getitem__ = __int__ = __float__ = __index__ = __call__ = __getattr__ = _refuse


# ----------------------------------------------------------------------------------------- the values
def encode(value, handles=None):
    """The wire form of ``value``. With ``handles`` (the candidate's side), an object that is not plain
    data is kept there and sent as a handle; without (the judge's side), it cannot be sent."""
    out = bytearray()
    _put(out, value, handles, 0)
    return bytes(out)


def _put(out, value, handles, depth):
    kind = type(value)
    if value is None:
        out += b"N"
    elif kind is bool:
        out += b"T" if value else b"F"
    elif kind is int:
        if -(1 << 63) <= value < (1 << 63):
            out += b"i" + _INT64.pack(value)
        else:
            raw = value.to_bytes(value.bit_length() // 8 + 1, "little", signed=True)
            out += b"I" + _SIZE.pack(len(raw)) + raw
    elif kind is float:
        out += b"f" + _DOUBLE.pack(value)
    elif kind is str or kind is bytes:
        raw = value.encode("utf-8", "surrogatepass") if kind is str else value
        out += (b"s" if kind is str else b"b") + _SIZE.pack(len(raw)) + raw
    elif kind is Handle:
        out += b"h" + _SIZE.pack(value.number)
    elif depth >= MAX_DEPTH:
        raise ValueError(f"a value nested deeper than {MAX_DEPTH} levels (or one that contains itself)")
    elif kind in _CONTAINERS:
        out += _CONTAINERS[kind] + _SIZE.pack(len(value))
        for item in value:
            _put(out, item, handles, depth + 1)
    elif kind is dict:
        out += b"d" + _SIZE.pack(len(value))
        for key, item in value.items():
            _put(out, key, handles, depth + 1)
            _put(out, item, handles, depth + 1)
    elif handles is None:
        raise TypeError(f"the test passed a {kind.__name__} to the candidate; only plain data can cross ({PLAIN})")
    else:
        handles.append(value)
        out += b"H" + _SIZE.pack(len(handles) - 1)
        _put(out, kind.__name__, None, depth)


def decode(data, handles=None):
    """The value of a wire form: on the judge's side (no ``handles``) anything but plain data and the
    candidate's handles raises CandidateError; on the candidate's side, handles become its objects."""
    try:
        value, end = _get(data, 0, handles, 0)
        if end != len(data):
            raise ValueError("bytes after the value")
    except (ValueError, TypeError, IndexError, OverflowError, RecursionError, struct.error) as exc:
        raise CandidateError(f"the candidate sent something that is not plain data ({exc})"[:300]) from None
    return value


def _get(data, pos, handles, depth):
    tag, pos = data[pos:pos + 1], pos + 1
    if tag in (b"N", b"T", b"F"):
        return {b"N": None, b"T": True, b"F": False}[tag], pos
    if tag == b"i":
        return _INT64.unpack_from(data, pos)[0], pos + 8
    if tag == b"f":
        return _DOUBLE.unpack_from(data, pos)[0], pos + 8
    if tag not in b"sbIhHltSzd" or len(tag) != 1:
        raise ValueError(f"unknown tag {tag!r}")
    (size,) = _SIZE.unpack_from(data, pos)
    pos += 4
    if tag in (b"s", b"b", b"I"):
        raw = data[pos:pos + size]
        if len(raw) != size:
            raise ValueError("a value cut short")
        value = raw.decode("utf-8", "surrogatepass") if tag == b"s" else (
            raw if tag == b"b" else int.from_bytes(raw, "little", signed=True))
        return value, pos + size
    if tag == b"h" and handles is not None:  # the candidate's side: one of its own objects, passed back
        return handles[size], pos
    if tag == b"H" and handles is None:  # the judge's side: an object that stayed with the candidate
        kind, pos = _get(data, pos, handles, depth + 1)
        if type(kind) is not str:
            raise ValueError("a handle without its type's name")
        return Handle(size, kind[:100]), pos
    if tag in (b"h", b"H"):  # a handle where its side may not make one
        raise ValueError(f"unknown tag {tag!r}")
    if depth >= MAX_DEPTH:
        raise ValueError(f"a value nested deeper than {MAX_DEPTH} levels")
    if size > len(data) - pos:  # every item takes a byte at least
        raise ValueError("a count larger than the message")
    items = []
    for _ in range(size * 2 if tag == b"d" else size):
        item, pos = _get(data, pos, handles, depth + 1)
        items.append(item)
    if tag == b"d":
        return dict(zip(items[0::2], items[1::2])), pos
    return _MAKERS[tag](items), pos


# ------------------------------------------------------------------------------------------- the wire
def send(fd, message, handles=None):
    data = encode(message, handles)
    if len(data) > MAX_MESSAGE:
        raise ValueError(f"a message of {len(data)} bytes, over the limit of {MAX_MESSAGE}")
    view = memoryview(_LENGTH.pack(len(data)) + data)
    while view:
        view = view[os.write(fd, view):]


def _read(fd, size):
    chunks, left = [], size
    while left:
        chunk = os.read(fd, min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive(fd, handles=None):
    """The next message; None when the other side has closed the pipe between messages."""
    header = _read(fd, 8)
    if header is None:
        return None
    (size,) = _LENGTH.unpack(header)
    if size > MAX_MESSAGE:
        raise CandidateError(f"the candidate sent a message of {size} bytes, over the limit of {MAX_MESSAGE}")
    body = _read(fd, size)
    if body is None:
        raise CandidateError("the candidate's process ended in the middle of a message")
    return decode(body, handles)


def one_line(exc):
    """What a traceback's last line says, clipped: 'ValueError: broken'."""
    if isinstance(exc, CandidateError):
        return str(exc)[:300]
    try:
        message = str(exc)
    except Exception:  # a hostile __str__
        message = ""
    name = type(exc).__name__
    return (f"{name}: {message}" if message else name).replace("\n", " ")[:300]


# ------------------------------------------------------------------------------------ the candidate's side
def exports(namespace):
    """What the candidate's program defines: name -> 'function', 'class', 'module:NAME' or 'value'."""
    found = {}
    for name, value in list(namespace.items()):
        if type(name) is not str or name.startswith("__"):
            continue
        if isinstance(value, _MODULE):
            found[name] = "module:" + str(getattr(value, "__name__", ""))
        elif isinstance(value, type):
            found[name] = "class"
        elif callable(value):
            found[name] = "function"
        else:
            found[name] = "value"
    return found


def serve_candidate(source, fd_in, fd_out, filename="main.py"):
    """Import the candidate's program as module 'candidate', say what it defines, then answer calls
    until the judge closes the pipe."""
    module = _MODULE("candidate")
    module.__file__ = filename
    sys.modules["candidate"] = module
    try:
        exec(compile(source, filename, "exec"), module.__dict__)
    except BaseException as exc:  # SystemExit too: the program did not load
        send(fd_out, {"loaded": False, "error": one_line(exc)})
        return
    send(fd_out, {"loaded": True, "exports": exports(module.__dict__)})
    handles = []
    while True:
        request = receive(fd_in, handles)
        if request is None:
            return
        try:
            target = module.__dict__[request["name"]]
            if request["op"] == "get":
                result = target
            else:
                if request["method"]:
                    target = getattr(target(), request["method"])
                result = target(*request["args"], **request["kwargs"])
            send(fd_out, {"n": request["n"], "value": result}, handles)
        except BaseException as exc:  # SystemExit and KeyboardInterrupt are answers too
            send(fd_out, {"n": request["n"], "raised": type(exc).__name__, "message": one_line(exc)})


# ---------------------------------------------------------------------------------------- the judge's side
class Candidate:
    """The judge's view of the candidate: the names its program defines, and stubs that call them."""

    def __init__(self, fd_in, fd_out):
        self.fd_in, self.fd_out, self.requests = fd_in, fd_out, 0
        hello = self._receive()
        if type(hello) is not dict or not (hello.get("loaded") is True or type(hello.get("error")) is str):
            raise CandidateError("the candidate sent something else than its program's names")
        if hello["loaded"] is not True:
            raise CandidateError(hello["error"][:300])
        names = hello.get("exports")
        if type(names) is not dict or not all(type(k) is str and type(v) is str for k, v in names.items()):
            raise CandidateError("the candidate sent something else than its program's names")
        self.exports = names

    def _receive(self):
        try:
            message = receive(self.fd_in)
        except OSError as exc:
            raise CandidateError(f"the candidate's pipe failed ({exc})") from None
        if message is None:
            raise CandidateError("the candidate's process ended before it answered")
        return message

    def request(self, message):
        self.requests += 1
        message["n"] = self.requests
        try:
            send(self.fd_out, message)
        except OSError:  # a broken pipe: it is gone
            raise CandidateError("the candidate's process ended before it answered") from None
        reply = self._receive()
        if type(reply) is not dict or type(reply.get("n")) is not int or reply["n"] != self.requests:
            raise CandidateError("the candidate answered out of turn")
        if "raised" in reply:
            raise _as_exception(reply["raised"], reply.get("message"))
        if "value" not in reply:
            raise CandidateError("the candidate answered without a value")
        return reply["value"]

    def function(self, name, method=None):
        """A stub for the candidate's ``name`` (with ``method``: that method of a new ``name()``)."""
        return Stub(self, name, method)

    def get(self, name):
        return self.request({"op": "get", "name": name})


class Stub:
    """Calls one of the candidate's functions over the pipe; what comes back is plain data."""

    def __init__(self, candidate, name, method=None):
        self._candidate, self._name, self._method = candidate, name, method

    def __call__(self, *args, **kwargs):
        return self._candidate.request({"op": "call", "name": self._name, "method": self._method,
                                        "args": list(args), "kwargs": kwargs})

    def __repr__(self):
        return f"<the candidate's {self._name}{'().' + self._method if self._method else ''}>"


def _as_exception(name, message):
    name, message = str(name)[:100], str(message)[:300]
    kind = getattr(builtins, name, None)
    if isinstance(kind, type) and issubclass(kind, Exception) and not issubclass(kind, _NOT_RAISED_AS_ITSELF):
        detail = message[len(name) + 2:] if message.startswith(name + ": ") else ("" if message == name else message)
        try:
            return kind(detail) if detail else kind()
        except Exception:  # an exception type that wants other arguments
            pass
    return CandidateError(f"the candidate raised {message or name}")


def used_names(code):
    """Every global name a compiled program and the functions in it may look up."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, _CODE):
            names |= used_names(const)
    return names


def bind_exports(candidate, code, namespace):
    """Give the test program the candidate's names it uses and does not have (builtins never)."""
    for name in sorted(used_names(code) & set(candidate.exports)):
        if name.startswith("__") or hasattr(builtins, name) or name in namespace:
            continue
        kind = candidate.exports[name]
        if kind in ("function", "class"):
            namespace[name] = candidate.function(name)
        elif kind == "value":
            try:
                namespace[name] = candidate.get(name)
            except CandidateError:  # too big to send, say: the test program does without it
                pass
        elif kind == "module:" + name and name in getattr(sys, "stdlib_module_names", ()):
            namespace[name] = __import__(name)  # the judge's own copy of the module


def run_judge(test_source, fd_in, fd_out, report_fd, filename="test.py"):
    """Run the test program against the candidate; write the verdict to ``report_fd``: "passed", or
"failed" and a line saying why."""
    try:
        code = compile(test_source, filename, "exec")
        candidate = Candidate(fd_in, fd_out)
        namespace = {"__name__": "judge", "__builtins__": builtins, "__candidate__": candidate}
        bind_exports(candidate, code, namespace)
        exec(code, namespace)
        verdict = "passed"
    except BaseException as exc:  # SystemExit from the test program is no pass either
        verdict = "failed\n" + one_line(exc)
    data = verdict.encode("utf-8", "replace")
    while data:
        data = data[os.write(report_fd, data):]
