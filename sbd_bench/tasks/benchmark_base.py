"""What the paper's benchmarks share: reading a local data file with a documented field layout,
building the prompt (plain, or through the tokenizer's chat template with the reasoning switch), and
recording how an output was judged.

    >>> task = load_task("gsm8k", path="gsm8k_test.jsonl", chat_template=True, thinking=False)

Options every benchmark task takes (``--task NAME:path=FILE`` and ``--chat-template`` / ``--thinking``):
  path            a .jsonl, .jsonl.gz or .json (a list of objects) file; nothing is downloaded
  chat_template   wrap the question in the tokenizer's chat template as one user turn
  thinking        passed to the template as ``enable_thinking`` (Qwen3-style reasoning models);
                  None leaves the template's default. Reasoning in ``<think>...</think>`` is dropped
                  before the answer is extracted.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

from ..types import Example, Task, UsageError
from . import TaskError, encode_chat, encode_prompt, iter_jsonl


def read_rows(path: Path) -> list[tuple[int, Any]]:
    """(line number, parsed object) for each non-blank line of a JSONL file, or (index + 1, item) for
    a JSON list. The number is what error messages call 'line'."""
    if path.exists() and not path.is_file():
        kind = "is a folder" if path.is_dir() else "is not a regular file (a device, a pipe or a socket)"
        raise TaskError(f"data file {path} {kind}: give the path to a local copy of the benchmark's file")
    if not path.is_file():
        raise TaskError(f"data file {path} does not exist: give the path to a local copy (nothing is downloaded)")
    if path.suffix == ".parquet":
        raise TaskError(f"{path}: parquet is not read here; convert it once with pandas.read_parquet("
                        f"'{path.name}').to_json('{path.stem}.jsonl', orient='records', lines=True)")
    try:
        if path.suffix != ".json":
            return list(iter_jsonl(path, TaskError, objects_only=False))
        text = path.read_text(encoding="utf-8-sig")  # a leading BOM is no content
    except UnicodeDecodeError as exc:
        raise TaskError(f"{path}: not UTF-8 text (byte {exc.start}); save the file as UTF-8") from None
    except (OSError, EOFError) as exc:  # a .gz that is not gzip, or is cut short
        raise TaskError(f"{path}: cannot be read ({exc}); give an intact .jsonl, .jsonl.gz or .json file") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TaskError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); "
                        "give a JSON list or a JSONL file") from None
    if not isinstance(data, list):
        raise TaskError(f"{path}: expected a JSON list of objects (or a .jsonl file with one object per line)")
    return list(enumerate(data, start=1))


def strip_thinking(output: str) -> str:
    """What follows the last ``</think>``; an output still inside its reasoning has no answer yet."""
    if "</think>" in output:
        return output.rsplit("</think>", 1)[1]
    return "" if "<think>" in output else output


class BenchmarkTask(Task):
    """Base of the file-backed benchmarks. Subclasses set ``layout`` (documented fields), implement
    ``make_example`` (row -> Example), ``plain_prompt`` / ``chat_prompt`` and ``judge``."""

    layout: ClassVar[str] = ""  # e.g. "question (str), answer (str ending '#### N')"
    plain_stop: ClassVar[tuple[str, ...]] = ()
    chat_stop: ClassVar[tuple[str, ...]] = ()

    def __init__(self, path: str | Path | None = None, chat_template: bool = False, thinking: bool | None = None):
        if thinking is not None and not chat_template:
            raise TaskError("--thinking only applies through a chat template: add --chat-template")
        self.chat_template, self.thinking = bool(chat_template), thinking
        self.stop = self.chat_stop if chat_template else self.plain_stop
        self.path = Path(path) if path is not None else None
        self._examples = self.load()

    # ------------------------------------------------------------------------------ loading
    def load(self) -> list[Example]:
        if self.path is None:
            raise TaskError(f"task '{self.name}' reads a local data file: pass --task {self.name}:path=FILE "
                            f"(fields: {self.layout})")
        examples, seen = [], set()
        for line, row in read_rows(self.path):
            if not isinstance(row, dict):
                raise TaskError(f"{self.path}:{line}: expected a JSON object with fields {self.layout}")
            example = self.make_example(row, line)
            if example.id in seen:
                raise TaskError(f"{self.path}:{line}: duplicate id {example.id!r}; ids must be unique")
            seen.add(example.id)
            examples.append(example)
        if not examples:
            raise TaskError(f"{self.path} holds no examples (expected one object per line with {self.layout})")
        return examples

    def field(self, row: dict, line: int, *names: str, kind: type | tuple = str):
        """The first of ``names`` present in ``row``; a missing or mistyped field names itself and the line."""
        for name in names:
            if name in row and row[name] is not None:
                if not isinstance(row[name], kind):
                    want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
                    raise TaskError(f"{self.path}:{line}: field '{name}' must be a {want} "
                                    f"(got {type(row[name]).__name__}); {self.name} layout: {self.layout}")
                return row[name]
        where = f"{self.path}:{line}" if self.path else f"{self.name} problem {line}"
        raise TaskError(f"{where}: missing field '{' or '.join(names)}'; {self.name} layout: {self.layout}")

    def examples(self, split: str = "test") -> list[Example]:
        return list(self._examples)

    # ------------------------------------------------------------------------------ prompts
    def make_example(self, row: dict, line: int) -> Example:
        raise NotImplementedError

    def plain_prompt(self, example: Example) -> str:
        return example.prompt

    def chat_prompt(self, example: Example) -> str:
        return example.prompt

    def encode(self, example: Example, tokenizer) -> list[int]:
        if self.chat_template:
            return encode_chat(tokenizer, self.chat_prompt(example), self.thinking)
        return encode_prompt(tokenizer, self.plain_prompt(example))

    # ------------------------------------------------------------------------------ scoring
    def judge(self, example: Example, answer_text: str) -> tuple[bool, dict]:
        """(correct, detail) for an output already cut at the stop strings, reasoning dropped."""
        raise NotImplementedError

    def verdict(self, example: Example, output: str) -> tuple[bool | None, dict | None]:
        """The judgement of any string a model may write: an output that breaks a judge (a bug there,
        or an input it did not foresee) is a failed verdict saying why, never an exception that would
        cost the samples decoded with it their records. Only a problem of the run (a UsageError: bad
        data, a sandbox that cannot run programs here) is raised."""
        from .scoring import cut_at_stop

        try:
            return self.judge(example, strip_thinking(cut_at_stop(output, self.stop)))
        except UsageError:
            raise
        except Exception as exc:  # noqa: BLE001 - the output's verdict, with the reason
            return False, {"error": f"the output could not be judged: {type(exc).__name__}: {exc}"[:300]}

    def score(self, example: Example, output: str) -> bool | None:
        return self.verdict(example, output)[0]
