"""Tasks: built-in ones register themselves with ``@register_task``; any JSONL file with ``id``,
``prompt`` and optional ``answer`` per line is a task too.

    >>> task = load_task("path/to/problems.jsonl")
    >>> task.examples()[0].prompt
"""
from __future__ import annotations

import importlib
import json
import pkgutil
from pathlib import Path

from ..types import Example, Task, UsageError


class TaskError(UsageError):
    """A task name or data file that cannot be used; the message names the problem and the fix."""


def _import_builtin_tasks() -> None:
    for info in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{info.name}")


def iter_jsonl(path: str | Path, error: type[UsageError] = TaskError):
    """(line number, object) for each non-blank line; ``error`` names the file and line of a bad one."""
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise error(f"{path}:{number}: not valid JSON ({exc.msg}); write one JSON object per line") from None
            if not isinstance(row, dict):
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
            meta = {"stop": list(row["stop"])} if isinstance(row.get("stop"), list) else {}
            examples.append(Example(str(row["id"]), row["prompt"], None if answer is None else str(answer), meta))
        if not examples:
            raise TaskError(f"{self.path} holds no examples: add lines like {{\"id\": \"1\", \"prompt\": \"...\"}}")
        return examples

    def examples(self, split: str = "test") -> list[Example]:
        return list(self._examples)


def load_task(spec: str, **options) -> Task:
    """``name``, ``name:key=value;key=value`` (e.g. ``gsm8k:path=data/gsm8k.jsonl``) or a JSONL path.
    ``options`` (e.g. chat_template=True) are passed on to the task's constructor with the spec's."""
    import inspect

    from ..registry import _did_you_mean, task_registry

    registry = task_registry()
    name, _, option_text = spec.partition(":")
    if name in registry:
        for item in filter(None, (p.strip() for p in option_text.split(";"))):
            key, eq, value = item.partition("=")
            if not eq or not value:
                raise TaskError(f"bad task option '{item}' in '{spec}': write {name}:key=value (e.g. {name}:path=FILE)")
            options[key.strip()] = value.strip()
        cls = registry[name]
        named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        params = inspect.signature(cls.__init__).parameters.values() if cls.__init__ is not object.__init__ else ()
        accepted = [p.name for p in params if p.name != "self" and p.kind in named]
        for key in options:
            if key not in accepted:
                raise TaskError(f"task '{name}' has no option '{key}' (its options: {', '.join(accepted) or 'none'})")
        return cls(**options)
    path = Path(spec)
    if path.suffix == ".jsonl" or path.exists():
        if not path.is_file():
            raise TaskError(f"task file {path} does not exist: give a JSONL file or a built-in task name")
        if options:
            raise TaskError(f"options {', '.join(options)} apply to built-in tasks only, not to the JSONL file {path}")
        return JsonlTask(path)
    raise TaskError(_did_you_mean(name, registry, "task") + " (or a path to a .jsonl file)")


_import_builtin_tasks()
