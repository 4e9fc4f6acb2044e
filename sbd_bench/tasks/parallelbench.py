"""ParallelBench's tasks (furiosa-ai, ICLR 2026), read from a user's own clone and scored as ParallelBench scores them.

    git clone https://github.blesdmm.dns-dynamic.net/furiosa-ai/ParallelBench ~/ParallelBench && git -C ~/ParallelBench checkout 72de8f7
    python -m sbd_bench run --task parallelbench:root=~/ParallelBench --chat-template --solver all
    python -m sbd_bench run --task "parallelbench/waiting_line/copy:root=~/ParallelBench" --chat-template

ParallelBench has no license: nothing of it is in sbd_bench; its files are read from ``root`` at run time.
Commit 72de8f7 (``PINNED_COMMIT``) ships every task as ``dataset/parallel_bench/data/output/test/<group>/<task>.jsonl``
with a ``task_config.yaml`` per group (its later rewrite loads them from the Hugging Face hub instead).

Prompts (``dataset/parallel_bench/__init__.py`` there): a conversation, each in-context example a user turn
(the task's prompt filled with the example's input) and an assistant turn (its answer, or its answer's
``example``), then the query as a user turn; a literal ``\\n`` in a filled prompt is a newline. With
``--chat-template`` it goes through the model's chat template as ParallelBench's runs do (its numbers need
that); without, its turns are joined by blank lines. Generation lengths as ParallelBench's paper runs: 32
tokens for the waiting line, 64 for the rest; greedy unless the run samples.

Scoring (``dataset/parallel_bench/metrics.py`` there): the 12 tasks of the waiting line and the puzzles are
rule-checked, 0 or 1 per sample, here in ``_RULES``; the task score is the mean (x 100 in the report). The
5 text-writing tasks need LanguageTool's grammar check (Java and its server) and ROUGE-L, BLEU or BERTScore
weights: refused in one line (``NEEDS``). ``parallelbench:root=DIR`` names the 12.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from ..types import Example, PARALLELBENCH_PREFIX, Task
from . import TaskError, encode_chat, encode_prompt, register_task

PINNED_COMMIT = "72de8f73246ae5b7c742c7eeae9a9853a90084ac"
DATA = Path("dataset/parallel_bench/data/output/test")
CLONE = (f"git clone https://github.blesdmm.dns-dynamic.net/furiosa-ai/ParallelBench DIR && git -C DIR checkout {PINNED_COMMIT[:7]}")

WAITING_LINE = ("copy", "insert_index", "insert_random", "remove_index", "remove_random", "replace_index",
                "replace_random", "reverse", "shuffle", "sort")
RULE_TASKS = (*(f"waiting_line/{t}" for t in WAITING_LINE), "puzzle/latin_square_n4", "puzzle/sudoku_n4_12")
NEEDS = {  # the 5 text-writing tasks: what their metric needs that is not here
    "paraphrase_summarize/chatgpt-paraphrases": "BLEU, BERTScore with roberta-large weights and LanguageTool's "
                                                "grammar check (Java 17 and its server)",
    "paraphrase_summarize/samsum": "ROUGE-L and LanguageTool's grammar check (Java 17 and its server)",
    **{f"words_to_sentence/{level}": "LanguageTool's grammar check (Java 17 and its server)"
       for level in ("easy", "medium", "hard")},
}


# --------------------------------------------------------------------------------------- the rules
def parse_list(text: str) -> list[str]:
    """ParallelBench's lenient list reading: what lies after the last '[' and before the next ']',
    split at commas, each item stripped of quotes and spaces, empty items left out."""
    if "[" in text:
        text = text.rsplit("[", 1)[1]
    if "]" in text:
        text = text.split("]", 1)[0]
    return [item.strip('" ') for item in text.strip("[]").split(",") if item.strip()]


def _words(value) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def list_match(output: str, answer) -> bool:
    """The list equals the gold list (copy, reverse, sort, and the *_index edits)."""
    return parse_list(output) == parse_list(answer)


def list_shuffle(output: str, answer: dict) -> bool:
    """The same people in another order."""
    got = parse_list(output)
    return sorted(got) == sorted(answer["input"]) and got != answer["input"]


def _removed_one_by_one(longer: list[str], shorter: list[str], n: int) -> bool:
    """``shorter`` is ``longer`` with ``n`` distinct items deleted (their first occurrences), order kept."""
    if len(shorter) != len(longer) - n:
        return False
    rest = list(longer)
    for item in set(longer) - set(shorter):  # ParallelBench's rule: the names missing, each deleted once (so a
        rest.remove(item)                     # count of them other than n cannot leave ``shorter``)
    return rest == shorter


def list_random_insert(output: str, answer: dict) -> bool:
    """The new person(s) somewhere, everyone else in the original order."""
    got, original = parse_list(output), list(answer["input"])
    if answer.get("word") is None:
        return _removed_one_by_one(got, original, answer.get("n_words", 1))
    for word in _words(answer["word"]):
        if word not in got:
            return False
        got.remove(word)
    return got == original


def list_random_remove(output: str, answer: dict) -> bool:
    """One person (``n_words``) gone, everyone else in the original order."""
    return _removed_one_by_one(list(answer["input"]), parse_list(output), answer.get("n_words", 1))


def list_random_replace(output: str, answer: dict) -> bool:
    """As long as the original; the new person at the first place they appear, the rest unchanged."""
    got, original = parse_list(output), list(answer["input"])
    if len(got) != len(original):
        return False
    word = answer.get("word")
    if word is None:
        return sum(a != b for a, b in zip(got, original)) == answer.get("n_words", 1)
    if word not in got:
        return False
    original[got.index(word)] = word
    return got == original


def latin_square(output: str, answer: dict) -> bool:
    """The first ``size`` lines whose comma-separated cells are the symbol set form a Latin square: every
    row and column holds every symbol (and the given first row, if any)."""
    symbols = set(answer["symbols"])
    lines = [line.strip() for line in output.split("\n") if line.strip()]
    rows = [[cell.strip() for cell in line.split(",")] for line in lines
            if {cell.strip() for cell in line.split(",")} == symbols][:len(symbols)]
    if len(rows) < len(symbols):  # none at all would pass the checks below
        return False
    if any(set(line) != symbols for line in [*rows, *zip(*rows)]):
        return False
    return answer.get("first_row") is None or rows[0] == answer["first_row"]


def _sudoku_grid(text: str, strict: bool) -> list[list[int]] | None:
    """4 rows of 4 digits. Lenient (outputs): spaces and commas dropped, lines with 4 digits kept, exactly
    4 of them. Strict (the gold grid): 4 lines of 4 digits each."""
    lines = [line.strip() for line in text.strip().split("\n") if line.strip()]
    if strict:
        ok = len(lines) == 4 and all(len(line) == 4 and line.isdigit() for line in lines)
        return [[int(c) for c in line] for line in lines] if ok else None
    rows = [[int(d) for d in re.findall(r"\d", line.replace(" ", "").replace(",", ""))] for line in lines]
    rows = [row for row in rows if len(row) == 4]
    return rows if len(rows) == 4 else None


def sudoku(output: str, answer: str) -> bool:
    """The grid is the gold solution."""
    return _sudoku_grid(output, strict=False) == _sudoku_grid(answer, strict=True)


# metric name in task_config.yaml -> (rule, what its answer must hold: "list" a gold list string, "grid" a
# gold sudoku, else the keys of its answer object)
_RULES = {
    "list_match_score": (list_match, "list"),
    "list_shuffle_score": (list_shuffle, ("input",)),
    "list_random_insert_score": (list_random_insert, ("input", "word")),
    "list_random_remove_score": (list_random_remove, ("input",)),
    "list_random_replace_score": (list_random_replace, ("input", "word")),
    "latin_square_score": (latin_square, ("symbols",)),
    "sudoku_score": (sudoku, "grid"),
}


# ---------------------------------------------------------------------------------------- the clone
def clone_commit(root: Path) -> str | None:
    """The commit a git clone at ``root`` has checked out (None where that cannot be read: no .git folder,
    a worktree's .git file, an unpacked ref)."""
    git = root / ".git"
    try:
        head = (git / "HEAD").read_text().strip()
        if not head.startswith("ref: "):
            return head
        ref = head[5:]
        if (git / ref).is_file():
            return (git / ref).read_text().strip()
        for line in (git / "packed-refs").read_text().splitlines():
            if line.endswith(" " + ref):
                return line.split()[0]
    except OSError:
        return None
    return None


def check_root(root: str | None, name: str) -> Path:
    """The clone's folder, refused in one line when it is not ParallelBench at ``PINNED_COMMIT``."""
    if root is None:
        raise TaskError(f"task '{name}' reads a local clone of ParallelBench: pass --task {name}:root=DIR "
                        f"({CLONE})")
    path = Path(root).expanduser()
    if not path.is_dir():
        raise TaskError(f"ParallelBench root {path} is not a folder: clone it there ({CLONE.replace('DIR', str(path))})")
    commit = clone_commit(path)
    if commit is not None and commit != PINNED_COMMIT:
        raise TaskError(f"{path} is ParallelBench at commit {commit[:7]}, not {PINNED_COMMIT[:7]}, whose task files "
                        f"sbd_bench reads (later commits load them from the hub): git -C {path} checkout {PINNED_COMMIT[:7]}")
    if not (path / DATA).is_dir():
        raise TaskError(f"{path} has no {DATA}: give the root of a ParallelBench clone at {PINNED_COMMIT[:7]} "
                        f"({CLONE.replace('DIR', str(path))})")
    return path


def read_config(path: Path, task_id: str) -> dict:
    """A task's entry in its group's task_config.yaml (prompt, metric)."""
    import yaml

    if not path.is_file():
        raise TaskError(f"{path} does not exist: the clone lacks {task_id}'s group configuration; check it out "
                        f"again at {PINNED_COMMIT[:7]}")
    try:
        configs = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise TaskError(f"{path}: not readable YAML ({str(exc).splitlines()[0]}); check the file out again") from None
    entry = configs.get(task_id) if isinstance(configs, dict) else None
    if not isinstance(entry, dict) or not isinstance(entry.get("prompt"), str) or not isinstance(entry.get("metric"), str):
        raise TaskError(f"{path}: no entry '{task_id}' with a 'prompt' and a 'metric'; check the file out again "
                        f"at {PINNED_COMMIT[:7]}")
    return entry


class ParallelBenchTask(Task):
    """One ParallelBench task from a clone at ``root``; subclasses (one per task, below) set ``task_id``."""

    task_id = ""

    def __init__(self, root: str | None = None, chat_template: bool = False, thinking: bool | None = None):
        if self.task_id in NEEDS:
            raise TaskError(f"task '{self.name}' is scored with {NEEDS[self.task_id]}, which sbd_bench does not run "
                            f"offline: run the 12 rule-checked tasks instead (--task parallelbench:root=DIR)")
        if thinking is not None and not chat_template:
            raise TaskError("--thinking only applies through a chat template: add --chat-template")
        self.chat_template, self.thinking = bool(chat_template), thinking
        self.root = check_root(root, self.name)
        config = read_config(self.root / DATA / self.task_id.split("/")[0] / "task_config.yaml", self.task_id)
        if config["metric"] not in _RULES:
            raise TaskError(f"task '{self.name}': its metric '{config['metric']}' is not one of ParallelBench's "
                            f"rule checks at {PINNED_COMMIT[:7]} ({', '.join(_RULES)}); check the clone out again")
        self.prompt, self.metric = config["prompt"], config["metric"]
        self.file = self.root / DATA / f"{self.task_id}.jsonl"
        self._examples = self._read()

    def _read(self) -> list[Example]:
        from . import iter_jsonl

        if not self.file.is_file():
            raise TaskError(f"{self.file} does not exist: the clone lacks task {self.task_id}; check it out again at "
                            f"{PINNED_COMMIT[:7]}")
        examples = [self._example(row, number) for number, row in iter_jsonl(self.file)]
        if not examples:
            raise TaskError(f"{self.file} holds no examples; check it out again at {PINNED_COMMIT[:7]}")
        return examples

    def _example(self, row: dict, number: int) -> Example:
        where = f"{self.file}:{number}"
        fix = f"the clone's files must be ParallelBench's at {PINNED_COMMIT[:7]} (git -C {self.root} checkout -- .)"
        sample_input, answer = row.get("input"), row.get("answer")
        if not isinstance(sample_input, dict):
            raise TaskError(f"{where}: 'input' must be an object of the prompt's fields; {fix}")
        _, needs = _RULES[self.metric]
        if needs in ("list", "grid"):
            if not isinstance(answer, str):
                raise TaskError(f"{where}: 'answer' must be a string (the gold {needs}) for {self.metric}; {fix}")
            if needs == "grid" and _sudoku_grid(answer, strict=True) is None:
                raise TaskError(f"{where}: 'answer' is not 4 lines of 4 digits (a solved 4x4 sudoku); {fix}")
        elif not (isinstance(answer, dict) and all(key in answer for key in needs)):
            raise TaskError(f"{where}: 'answer' must be an object with {', '.join(needs)} for {self.metric}; {fix}")
        turns = []
        for icl in sample_input.get("icl_examples") or []:
            if not isinstance(icl, dict) or not isinstance(icl.get("input"), dict) or "answer" not in icl:
                raise TaskError(f"{where}: each of 'icl_examples' must be an object with 'input' and 'answer'; {fix}")
            reply = icl["answer"] if isinstance(icl["answer"], str) else (icl["answer"] or {}).get("example")
            if not isinstance(reply, str):
                raise TaskError(f"{where}: an in-context example's 'answer' must be a string or hold an 'example'; {fix}")
            turns += [{"role": "user", "content": self._fill(icl["input"], where, fix)},
                      {"role": "assistant", "content": reply}]
        turns.append({"role": "user", "content": self._fill(sample_input, where, fix)})
        gold = answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)
        return Example(str(number), "\n\n".join(t["content"] for t in turns), gold,
                       {"messages": turns, "answer": answer})

    def _fill(self, fields: dict, where: str, fix: str) -> str:
        try:
            return self.prompt.format(**fields).replace("\\n", "\n")
        except (KeyError, IndexError) as exc:
            raise TaskError(f"{where}: 'input' lacks the field {exc} that the task's prompt uses; {fix}") from None

    def examples(self, split: str = "test") -> list[Example]:
        return list(self._examples)

    def encode(self, example: Example, tokenizer) -> list[int]:
        if self.chat_template:
            return encode_chat(tokenizer, example.meta["messages"], self.thinking)
        return encode_prompt(tokenizer, example.prompt)

    def verdict(self, example: Example, output: str) -> tuple[bool | None, dict | None]:
        rule, _ = _RULES[self.metric]
        try:
            return rule(output, example.meta["answer"]), {"metric": self.metric}
        except Exception as exc:  # noqa: BLE001 - an output a rule did not foresee fails, with the reason
            return False, {"metric": self.metric, "error": f"{type(exc).__name__}: {exc}"[:300]}

    def score(self, example: Example, output: str) -> bool | None:
        return self.verdict(example, output)[0]


def _register(task_id: str) -> None:
    group = task_id.split("/")[0]
    rule_checked = task_id in RULE_TASKS
    cls = type(f"ParallelBench_{re.sub(r'[^0-9A-Za-z]', '_', task_id)}", (ParallelBenchTask,), {
        "name": PARALLELBENCH_PREFIX + task_id, "task_id": task_id, "pack": "parallelbench" if rule_checked else None,
        "max_new_tokens": 32 if group == "waiting_line" else 64,
        "description": f"ParallelBench's {task_id} from a local clone (root=DIR at {PINNED_COMMIT[:7]})"
                       + ("" if rule_checked else f"; needs {NEEDS[task_id]}, refused"),
        "__module__": __name__})
    register_task(cls)


for _task_id in (*RULE_TASKS, *NEEDS):
    _register(_task_id)
