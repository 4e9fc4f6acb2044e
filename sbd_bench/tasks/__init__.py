"""Tasks: built-in ones register themselves with ``@register_task``; any JSONL file with ``id``,
``prompt`` and optional ``answer`` per line is a task too. Scoring helpers (``scoring``) live here,
beside the tasks that need them; the sandbox that runs generated code is ``sbd_bench.sandbox``.

    >>> task = load_task("path/to/problems.jsonl")
    >>> task.examples()[0].prompt
    >>> expand_tasks("suite")          # every built-in synthetic task
"""
from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path

from ..types import Example, Task, UsageError, did_you_mean


class TaskError(UsageError):
    """A task name or data file that cannot be used; the message names the problem and the fix."""


_TASKS: dict[str, type[Task]] = {}


def register_task(cls: type[Task]) -> type[Task]:
    """Class decorator for built-in tasks (modules in this package)."""
    if cls.name in _TASKS and _TASKS[cls.name] is not cls:
        raise TaskError(f"task name '{cls.name}' registered twice")
    _TASKS[cls.name] = cls
    return cls


def task_registry() -> dict[str, type[Task]]:
    """Every built-in task by name (the package registers them all when it is imported)."""
    return dict(_TASKS)


def expand_tasks(spec: str) -> list[str]:
    """Comma list of task names or JSONL paths; 'suite' is every built-in synthetic task, and
    'suite:key=value' each of them with that option ('suite:n_test=520')."""
    names: list[str] = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        head, colon, options = item.partition(":")
        if head == "suite":
            suite = [name for name, cls in _TASKS.items() if cls.suite]
            if not suite:
                raise UsageError("no built-in synthetic suite is installed: name a task or a JSONL file with --task")
            names += [f"{name}{colon}{options}" for name in suite]
        else:
            names.append(item)
    if not names:
        raise UsageError("empty --task: give a task name, 'suite', or a JSONL file")
    return list(dict.fromkeys(names))


def _import_builtin_tasks() -> None:
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


def iter_jsonl(path: str | Path, error: type[UsageError] = TaskError, objects_only: bool = True):
    """(line number, value) for each non-blank line of a JSONL file (gzipped if it ends in .gz); ``error``
    names the file and line of a bad one. ``objects_only``: each value must be a JSON object."""
    import gzip

    with (gzip.open if str(path).endswith(".gz") else open)(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8-sig" if number == 1 else "utf-8")  # a BOM (Windows editors) is no content
            except UnicodeDecodeError:
                raise error(f"{path}:{number}: not UTF-8 text; save the file as UTF-8 (JSON Lines are UTF-8)") from None
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise error(f"{path}:{number}: not valid JSON ({exc.msg}); write one JSON object per line") from None
            if objects_only and not isinstance(row, dict):
                raise error(f"{path}:{number}: expected a JSON object, one per line")
            yield number, row


class JsonlTask(Task):
    """Examples from a JSONL file: one object per line with ``id``, ``prompt``, optional ``answer``
    (exact match after stripping whitespace) and optional ``stop`` (a list of stop strings)."""

    description = "examples from a JSONL file (id, prompt, optional answer)"

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.name = self.path.stem
        self._examples = self._read()
        self.stop = tuple(dict.fromkeys(s for e in self._examples for s in e.meta.get("stop", ())))

    def _read(self) -> list[Example]:
        examples, seen = [], set()
        for number, row in iter_jsonl(self.path):
            for key in ("id", "prompt"):
                if key not in row:
                    raise TaskError(f"{self.path}:{number}: missing field '{key}' (each line needs 'id' and 'prompt')")
            if not isinstance(row["prompt"], str) or not row["prompt"]:
                raise TaskError(f"{self.path}:{number}: 'prompt' must be a non-empty string")
            if str(row["id"]) in seen:
                raise TaskError(f"{self.path}:{number}: duplicate id {row['id']!r}; ids must be unique")
            seen.add(str(row["id"]))
            answer = row.get("answer")
            stop = row.get("stop")
            if stop is not None and not (isinstance(stop, list) and all(isinstance(x, str) and x for x in stop)):
                raise TaskError(f"{self.path}:{number}: 'stop' must be a list of non-empty strings "
                                f"(got {json.dumps(stop)[:40]}); write \"stop\": [\"...\"]")
            meta = {"stop": list(stop)} if stop else {}
            examples.append(Example(str(row["id"]), row["prompt"], None if answer is None else str(answer), meta))
        if not examples:
            raise TaskError(f"{self.path} holds no examples: add lines like {{\"id\": \"1\", \"prompt\": \"...\"}}")
        return examples

    def examples(self, split: str = "test") -> list[Example]:
        return list(self._examples)


def task_options(spec: str) -> list[str]:
    """The options the task ``spec`` names takes (its constructor's parameters); none for a JSONL file."""
    import inspect

    cls = task_registry().get(spec.partition(":")[0])
    if cls is None or cls.__init__ is object.__init__:
        return []
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [p.name for p in inspect.signature(cls.__init__).parameters.values() if p.name != "self" and p.kind in named]


def load_task(spec: str, **options) -> Task:
    """``name``, ``name:key=value;key=value`` (e.g. ``gsm8k:path=data/gsm8k.jsonl``) or a JSONL path.
    ``options`` (e.g. chat_template=True) are passed on to the task's constructor with the spec's."""
    registry = task_registry()
    name, _, option_text = spec.partition(":")
    if name in registry:
        given = set()
        for item in filter(None, (p.strip() for p in option_text.split(";"))):
            key, eq, value = item.partition("=")
            if not eq or not value:
                raise TaskError(f"bad task option '{item}' in '{spec}': write {name}:key=value (e.g. {name}:path=FILE)")
            if key.strip() in given:  # the last one would win without a word
                raise TaskError(f"task option '{key.strip()}' is given twice in '{spec}': give it once")
            given.add(key.strip())
            options[key.strip()] = value.strip()
        cls = registry[name]
        accepted = task_options(spec)
        for key in options:
            if key not in accepted:
                raise TaskError(f"task '{name}' has no option '{key}' (its options: {', '.join(accepted) or 'none'})")
        return cls(**options)
    path = Path(spec)
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.jsonl"))
        hint = f"one of the {len(inside)} in it, e.g. {path / inside[0]}" if inside else "a JSONL file"
        raise TaskError(f"task file {path} is a folder: give {hint}, or a built-in task name")
    if path.suffix == ".jsonl" or path.exists():
        if path.exists() and not path.is_file():  # /dev/null reads as no examples; a pipe can be read only once
            raise TaskError(f"task file {path} is not a regular file (a device, a pipe or a socket): give a JSONL "
                            f"file or a built-in task name")
        if not path.is_file():
            raise TaskError(f"task file {path} does not exist: give a JSONL file or a built-in task name")
        if options:
            raise TaskError(f"options {', '.join(options)} apply to built-in tasks only, not to the JSONL file {path}")
        return JsonlTask(path)
    raise TaskError(did_you_mean(name, registry, "task") + " (or a path to a .jsonl file)")


_import_builtin_tasks()
