"""Tasks: built-in ones register themselves with ``@register_task``; any JSONL file with ``id``,
``prompt`` (or chat ``messages``) and optional ``answer`` per line is a task too. Scoring helpers (``scoring``) live here,
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


def pack_members(head: str) -> list[str]:
    """The registered tasks a pack or group name stands for: a pack's own (``Task.pack``: 'parallelbench',
    its 12 rule-checked tasks), or every task under a group ('parallelbench/puzzle'); [] for other names."""
    if head in _TASKS:
        return []
    if any(cls.pack == head for cls in _TASKS.values()):
        return [name for name, cls in _TASKS.items() if cls.pack == head]
    return [name for name in _TASKS if name.startswith(head + "/")]


def expand_tasks(spec: str) -> list[str]:
    """Comma list of task names or JSONL paths; 'suite' is every built-in synthetic task, and
    'suite:key=value' each of them with that option ('suite:n_test=520'); a pack or group name
    (``pack_members``) its tasks, each with the options ('parallelbench:root=DIR')."""
    names: list[str] = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        head, colon, options = item.partition(":")
        if head == "suite":
            suite = [name for name, cls in _TASKS.items() if cls.suite]
            if not suite:
                raise UsageError("no built-in synthetic suite is installed: name a task or a JSONL file with --task")
            names += [f"{name}{colon}{options}" for name in suite]
        elif pack_members(head):
            names += [f"{name}{colon}{options}" for name in pack_members(head)]
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


def encode_prompt(tokenizer, text: str) -> list[int]:
    """A plain prompt's ids, with the tokenizer's special tokens (its BOS), but one BOS only: a prompt
    that already starts with it (a chat template rendered and pasted in) gets no second one."""
    ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    bos = getattr(tokenizer, "bos_token_id", None)
    return ids[1:] if bos is not None and ids[:2] == [bos, bos] else ids


def render_chat(tokenizer, messages: list[dict], generation_prompt: bool, thinking: bool | None = None) -> str:
    """The conversation as the tokenizer's chat template writes it (text, the template's own BOS in it)."""
    if not getattr(tokenizer, "chat_template", None):
        raise TaskError("--chat-template was given but this model's tokenizer has no chat template "
                        "(tokenizer_config.json / chat_template.jinja): drop --chat-template to use plain prompts")
    extra = {} if thinking is None else {"enable_thinking": thinking}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt, **extra)


def encode_chat(tokenizer, message: str | list[dict], thinking: bool | None = None) -> list[int]:
    """A user turn (a string) or a conversation (a list of messages) through the tokenizer's chat
    template, ready for the assistant's reply. The template is rendered as text and the text tokenised:
    training splits chat data the same way (training/data.py), so the tokens a model learns to write
    after a prompt follow exactly the prompt tokens it is given here, whatever the BPE merges."""
    messages = [{"role": "user", "content": message}] if isinstance(message, str) else message
    text = render_chat(tokenizer, messages, True, thinking)
    return tokenizer(text, add_special_tokens=False)["input_ids"]  # the template writes its own BOS


class JsonlTask(Task):
    """Examples from a JSONL file: one object per line with ``id``, ``prompt`` (or, with
    ``chat_template``, ``messages``: a conversation that ends before the assistant's reply), optional
    ``answer`` (exact match after stripping whitespace) and optional ``stop`` (a list of stop strings).
    ``chat_template``: each prompt is the user's message, through the tokenizer's chat template."""

    description = "examples from a JSONL file (id, prompt or messages, optional answer)"

    def __init__(self, path: str | Path, chat_template: bool = False, thinking: bool | None = None):
        if thinking is not None and not chat_template:
            raise TaskError("--thinking only applies through a chat template: add --chat-template")
        self.path = Path(path)
        self.name = self.path.stem
        self.chat_template, self.thinking = bool(chat_template), thinking
        self._examples = self._read()
        self.stop = tuple(dict.fromkeys(s for e in self._examples for s in e.meta.get("stop", ())))

    def _read(self) -> list[Example]:
        examples, seen = [], set()
        for number, row in iter_jsonl(self.path):
            if "id" not in row:
                raise TaskError(f"{self.path}:{number}: missing field 'id' (each line needs 'id' and 'prompt')")
            prompt, meta = self._prompt(row, number)
            if str(row["id"]) in seen:
                raise TaskError(f"{self.path}:{number}: duplicate id {row['id']!r}; ids must be unique")
            seen.add(str(row["id"]))
            answer = row.get("answer")
            stop = row.get("stop")
            if stop is not None and not (isinstance(stop, list) and all(isinstance(x, str) and x for x in stop)):
                raise TaskError(f"{self.path}:{number}: 'stop' must be a list of non-empty strings "
                                f"(got {json.dumps(stop)[:40]}); write \"stop\": [\"...\"]")
            if stop:
                meta["stop"] = list(stop)
            examples.append(Example(str(row["id"]), prompt, None if answer is None else str(answer), meta))
        if not examples:
            raise TaskError(f"{self.path} holds no examples: add lines like {{\"id\": \"1\", \"prompt\": \"...\"}}")
        return examples

    def _prompt(self, row: dict, number: int) -> tuple[str, dict]:
        """(the prompt text, meta): a line's ``prompt``, or its ``messages`` (kept in meta; their contents
        are the prompt text that the unknown-character count reads)."""
        where = f"{self.path}:{number}"
        if "messages" in row:
            if "prompt" in row:
                raise TaskError(f"{where}: holds both 'messages' and 'prompt': keep one of them")
            if not self.chat_template:
                raise TaskError(f"{where}: 'messages' is a conversation for the model's chat template: add "
                                f"--chat-template, or write the line with a plain 'prompt'")
            messages = row["messages"]
            if not (isinstance(messages, list) and messages and all(
                    isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                    for m in messages)):
                raise TaskError(f"{where}: 'messages' must be a non-empty list of {{\"role\": ..., \"content\": ...}} "
                                f"with string values")
            return "\n".join(m["content"] for m in messages), {"messages": messages}
        if "prompt" not in row:
            raise TaskError(f"{where}: missing field 'prompt' (each line needs 'id' and 'prompt'"
                            + (", or 'messages')" if self.chat_template else ")"))
        if not isinstance(row["prompt"], str) or not row["prompt"]:
            raise TaskError(f"{where}: 'prompt' must be a non-empty string")
        return row["prompt"], {}

    def examples(self, split: str = "test") -> list[Example]:
        return list(self._examples)

    def encode(self, example: Example, tokenizer) -> list[int]:
        if self.chat_template:
            return encode_chat(tokenizer, example.meta.get("messages", example.prompt), self.thinking)
        return encode_prompt(tokenizer, example.prompt)


JSONL_OPTIONS = ["chat_template", "thinking"]  # what a JSONL file task takes (from run's flags)


def task_options(spec: str) -> list[str]:
    """The options the task ``spec`` names takes (its constructor's parameters); a JSONL file's are
    ``JSONL_OPTIONS``."""
    import inspect

    cls = task_registry().get(spec.partition(":")[0])
    if cls is None:
        return list(JSONL_OPTIONS)
    if cls.__init__ is object.__init__:
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
        other = [key for key in options if key not in JSONL_OPTIONS]
        if other:
            raise TaskError(f"options {', '.join(other)} apply to built-in tasks only, not to the JSONL file {path}")
        return JsonlTask(path, **options)
    raise TaskError(did_you_mean(name, registry, "task") + " (or a path to a .jsonl file)")


_import_builtin_tasks()
