"""The built-in synthetic suite: four tasks generated deterministically from a seed, each with a
verifier, spanning the regimes where parallel decoding behaves differently.

    arith    addition with a digit-by-digit scratchpad          (long, fully predictable)
    reverse  reverse a string of 6 letters                      (copying, fully predictable)
    record   a JSON record: boilerplate around a few hard tokens (checked by json.loads)
    tag      pick ANY 3-letter name, then repeat it in capitals  (answer not unique: consistency)

    >>> task = load_task("tag")
    >>> ex = task.examples("test")[0]; ex.prompt, ex.answer
    ('tag 6230\\n', 'qel 6230 QEL')
    >>> task.score(ex, "abc 6230 ABC"), task.score(ex, "abc 6230 ABD")
    (True, False)

Splits: the test split is the first ``n_test`` distinct prompts of one seeded stream (40 unless the
task option asks for more: ``arith:n_test=520``; a larger one starts with the same 40); the train
split comes from another stream with every test prompt removed, so the two never share a prompt
(a train prompt may repeat: for ``tag`` that shows the model several valid names per prompt).
``answer`` is the reference completion (for ``tag``, one valid choice among many; training uses it).
"""
from __future__ import annotations

import json
import random
import re
import string

from ..types import Example, Task
from . import TaskError, register_task

LOWER = string.ascii_lowercase


class SyntheticTask(Task):
    suite = True
    prompts: int | None = None  # how many distinct prompts the generator can make, where it is few

    def __init__(self, seed: int = 0, n_train: int = 20000, n_test: int = 40):
        # options from a task spec (``arith:n_test=520``) arrive as strings
        self.seed, self.n_train, self.n_test = (_count(self.name, key, value, least) for key, value, least in
                                                (("seed", seed, 0), ("n_train", n_train, 1), ("n_test", n_test, 1)))
        if self.prompts is not None and self.n_test > self.prompts:
            raise TaskError(f"task {self.name}: n_test={self.n_test} asks for more distinct prompts than the "
                            f"{self.prompts} it can make: give n_test <= {self.prompts}")
        self._splits: dict[str, list[Example]] = {}

    def generate(self, rng: random.Random) -> tuple[str, str, dict]:
        """One (prompt, reference completion, meta) drawn from ``rng``."""
        raise NotImplementedError

    def verify(self, meta: dict, output: str) -> bool:
        raise NotImplementedError

    def score(self, example: Example, output: str) -> bool:
        return self.verify(example.meta, output.strip())

    def examples(self, split: str = "test") -> list[Example]:
        if split not in ("test", "train"):
            raise ValueError(f"split must be 'test' or 'train' (got {split!r})")
        if split not in self._splits:
            test = self._draw("test", self.n_test, exclude=set(), distinct=True)
            self._splits["test"] = test
            if split == "train":
                self._splits["train"] = self._draw("train", self.n_train, exclude={e.prompt for e in test})
        return list(self._splits[split])

    def _draw(self, split: str, n: int, exclude: set[str], distinct: bool = False) -> list[Example]:
        rng = random.Random(f"{self.name}/{split}/{self.seed}")
        seen, out = set(exclude), []
        tries = 0
        while len(out) < n:
            tries += 1
            if tries > 50 * n + 1000:
                raise RuntimeError(f"task {self.name}: cannot draw {n} distinct {split} prompts")
            prompt, answer, meta = self.generate(rng)
            if prompt in seen:
                continue
            if distinct:
                seen.add(prompt)
            out.append(Example(f"{split}-{len(out)}", prompt, answer, meta))
        return out


def _count(task: str, key: str, value, least: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = None
    if number is None or number < least or isinstance(value, bool) or str(number) != str(value).strip():
        example = {"seed": 1, "n_train": 20000, "n_test": 520}.get(key, least)
        raise TaskError(f"task {task}: {key}={value} must be an integer >= {least} (e.g. {task}:{key}={example})")
    return number


# ----------------------------------------------------------------------------------------- arith
def scratchpad(a: int, b: int) -> str:
    """'347+85' -> '7+5+0=12,4+8+1=13,3+0+1=04;432': one step per digit from the right, with carry."""
    da, db = str(a)[::-1], str(b)[::-1]
    steps, carry = [], 0
    for i in range(max(len(da), len(db))):
        x = int(da[i]) if i < len(da) else 0
        y = int(db[i]) if i < len(db) else 0
        s = x + y + carry
        steps.append(f"{x}+{y}+{carry}={s:02d}")
        carry = s // 10
    return ",".join(steps) + f";{a + b}"


@register_task
class Arith(SyntheticTask):
    name = "arith"
    description = "a+b with a digit-by-digit scratchpad (predictable)"
    max_new_tokens = 40

    def generate(self, rng):
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        return f"{a}+{b}=\n", scratchpad(a, b), {"a": a, "b": b}

    def verify(self, meta, output):
        steps, sep, total = output.partition(";")
        if not sep or not total.isdigit() or int(total) != meta["a"] + meta["b"]:
            return False
        # every scratchpad step must be the right digit sum with the right carry
        return output == scratchpad(meta["a"], meta["b"])


# --------------------------------------------------------------------------------------- reverse
@register_task
class Reverse(SyntheticTask):
    name = "reverse"
    description = "reverse a string of 6 letters (predictable copying)"
    max_new_tokens = 10

    def generate(self, rng):
        word = "".join(rng.choice(LOWER) for _ in range(6))
        return f"rev {word}\n", word[::-1], {"word": word}

    def verify(self, meta, output):
        return output == meta["word"][::-1]


# ---------------------------------------------------------------------------------------- record
@register_task
class Record(SyntheticTask):
    name = "record"
    description = "a JSON record: boilerplate around a few copied values, checked by json.loads"
    max_new_tokens = 48

    def generate(self, rng):
        name = "".join(rng.choice(LOWER) for _ in range(4))
        age, ok = rng.randint(10, 99), rng.random() < 0.5
        prompt = f"rec {name} {age} {'y' if ok else 'n'}\n"
        answer = json.dumps({"name": name, "age": age, "ok": ok})
        return prompt, answer, {"name": name, "age": age, "ok": ok}

    def verify(self, meta, output):
        try:
            value = json.loads(output)  # parsed, never executed
        except (ValueError, RecursionError):  # RecursionError: nested deeper than the decoder goes
            return False
        if not isinstance(value, dict) or set(value) != {"name", "age", "ok"}:
            return False
        # bool is a subclass of int in Python: compare types too, so "age": true is rejected
        return all(type(value[key]) is type(meta[key]) and value[key] == meta[key] for key in meta)


# ------------------------------------------------------------------------------------------- tag
TAG_PATTERN = re.compile(r"([a-z]{3}) (\d+) ([A-Z]{3})")


@register_task
class Tag(SyntheticTask):
    """Any 3-letter name is right, but it must come back in capitals at the end. The name's letters
    are genuinely uncertain (uniform in training), and each capital is certain only once its
    lowercase letter is revealed: revealing a letter and its capital in the same forward draws
    them independently and usually breaks the agreement."""

    name = "tag"
    description = "pick any 3-letter name, then repeat it in capitals (consistency, not unique)"
    max_new_tokens = 14
    prompts = 900  # the numbers 100..999

    def generate(self, rng):
        number = rng.randint(100, 999)
        name = "".join(rng.choice(LOWER) for _ in range(3))
        return f"tag {number}\n", f"{name} {number} {name.upper()}", {"number": number}

    def verify(self, meta, output):
        match = TAG_PATTERN.fullmatch(output)
        return bool(match) and match[2] == str(meta["number"]) and match[3] == match[1].upper()
