"""GSM8K, MATH500 and AIME from local files (see benchmark_base for the options).

    python -m sbd_bench run --task gsm8k:path=gsm8k_test.jsonl,math500:path=math500.jsonl --solver all
    python -m sbd_bench run --task "math500:path=math500.jsonl;scorer=simple"    # the earlier scorer

Field layouts (one JSON object per line; the names are those of the public releases; an example's
id is its id field if there is one, else its line number):
  gsm8k    question (str); answer (str whose final number follows '####', as in openai/gsm8k)
  math500  problem (str); answer (str), or else solution (str) holding a \\boxed{} answer;
           optional unique_id / id
  aime     problem or question (str); answer (str or int); optional id
Plain prompts ask for the format the answer is extracted from; chat prompts ask for \\boxed{}.

Scorers (option ``scorer``; docs/benchmarks.md has the rules and where they disagree):
  math_verify  (default) Hugging Face's math-verify as lighteval uses it (math_verifier.py), bounded in
               time; for GSM8K the final number compared exactly first, math-verify when that fails
  simple       the hand-written rules of scoring.py (normalised strings, exact numbers), the scorer of
               records written before math-verify
Every verdict runs both and records both (``score_detail``), so a reader sees which verdicts the other
scorer would change.
"""
from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path
from typing import ClassVar

from ..types import Example
from . import TaskError, register_task
from .benchmark_base import BenchmarkTask
from .math_verifier import BUDGET_S, math_verifier
from .scoring import extract_gsm8k, gsm8k_reference, last_boxed, math_equal, numeric_match

BOX_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
SCORERS = ("math_verify", "simple")
MATH_VERIFY_INSTALL = "pip install -c constraints.txt math-verify"


class MathTask(BenchmarkTask):
    """A benchmark whose answer is a number or a formula: judged by both scorers, decided by ``scorer``."""

    rule: ClassVar[str] = "latex"  # math_verifier's rule for this benchmark
    budget_s: float = BUDGET_S  # math-verify's wall clock per verdict

    def __init__(self, path: str | Path | None = None, chat_template: bool = False, thinking: bool | None = None,
                 scorer: str = "math_verify"):
        if scorer not in SCORERS:
            raise TaskError(f"task '{self.name}' has no scorer '{scorer}': write scorer=math_verify (the default, "
                            f"Hugging Face's math-verify) or scorer=simple (the earlier hand-written rules)")
        missing = [name for name in ("math_verify", "latex2sympy2_extended", "antlr4") if find_spec(name) is None]
        if missing:  # said before a model is loaded, not after decoding
            raise TaskError(f"task '{self.name}' judges answers with math-verify, and {', '.join(missing)} is not "
                            f"installed: {MATH_VERIFY_INSTALL}")
        self.scorer = scorer
        super().__init__(path, chat_template, thinking)

    def simple_verdict(self, example: Example, answer_text: str) -> tuple[bool, str | None]:
        """(correct, extracted answer) by scoring.py's rules."""
        raise NotImplementedError

    def math_verify_verdict(self, simple: bool, verified: bool) -> bool:
        """The verdict of scorer=math_verify, given the simple rule's and math-verify's."""
        return verified

    def judge(self, example: Example, answer_text: str) -> tuple[bool, dict]:
        simple, extracted = self.simple_verdict(example, answer_text)
        checked = math_verifier().verdict(self.rule, answer_text, example.answer, self.budget_s)
        verdicts = {"math_verify": self.math_verify_verdict(simple, checked["correct"]), "simple": simple}
        other = "simple" if self.scorer == "math_verify" else "math_verify"
        detail = {"scorer": self.scorer, "other_scorer": other, "other_correct": verdicts[other],
                  "math_verify": checked, "simple": {"correct": simple, "extracted": extracted}}
        return verdicts[self.scorer], detail


@register_task
class GSM8K(MathTask):
    name = "gsm8k"
    description = "grade-school math word problems (local file: question, answer with '#### N')"
    layout = "question (str), answer (str ending in '#### N')"
    plain_stop = ("\n\nQuestion:", "\nQuestion:")
    max_new_tokens = 512
    rule = "expression"

    def make_example(self, row: dict, line: int) -> Example:
        question = self.field(row, line, "question")
        answer_field = self.field(row, line, "answer")
        try:
            answer = gsm8k_reference(answer_field)
        except ValueError as exc:
            raise TaskError(f"{self.path}:{line}: field 'answer' has {exc}: GSM8K answers end with '#### N'") from None
        return Example(str(row.get("id", line)), question, answer)

    def plain_prompt(self, example: Example) -> str:
        # GSM8K's own layout: a model trained on it ends its solution with '#### N'
        return f"Question: {example.prompt}\nAnswer:"

    def chat_prompt(self, example: Example) -> str:
        return f"{example.prompt}\n{BOX_INSTRUCTION}"

    def simple_verdict(self, example: Example, answer_text: str) -> tuple[bool, str | None]:
        extracted = extract_gsm8k(answer_text)
        return numeric_match(extracted, example.answer), extracted

    def math_verify_verdict(self, simple: bool, verified: bool) -> bool:
        # the final number first (GSM8K's '####' is no anchor of math-verify's); math-verify when it fails
        # (a \frac, a \text{} around the number, a number math-verify finds and the number rule does not)
        return simple or verified


@register_task
class MATH500(MathTask):
    name = "math500"
    description = "competition math, \\boxed{} answer checked by math-verify (local file: problem, answer or solution)"
    layout = "problem (str), answer (str) or solution (str with \\boxed{})"
    plain_stop = ("\n\nProblem:",)
    max_new_tokens = 2048

    def make_example(self, row: dict, line: int) -> Example:
        problem = self.field(row, line, "problem", "question")
        if row.get("answer") is not None:
            answer = str(self.field(row, line, "answer", kind=(str, int, float)))
        else:
            answer = last_boxed(self.field(row, line, "answer", "solution"))
            if answer is None:
                raise TaskError(f"{self.path}:{line}: field 'solution' holds no \\boxed{{}} answer and there is no "
                                f"'answer' field; {self.name} layout: {self.layout}")
        ident = row.get("unique_id", row.get("id", line))
        return Example(str(ident), problem, answer)

    def plain_prompt(self, example: Example) -> str:
        return f"Problem:\n{example.prompt}\n\n{BOX_INSTRUCTION}\n\nSolution:\n"

    def chat_prompt(self, example: Example) -> str:
        return f"{example.prompt}\n{BOX_INSTRUCTION}"

    def simple_verdict(self, example: Example, answer_text: str) -> tuple[bool, str | None]:
        extracted = last_boxed(answer_text)
        return math_equal(extracted, example.answer), extracted


@register_task
class AIME(MATH500):
    name = "aime"
    description = "AIME problems, integer answer checked by math-verify (local file: problem, answer)"
    layout = "problem or question (str), answer (str or int)"
    max_new_tokens = 4096
    rule = "expression"

    def make_example(self, row: dict, line: int) -> Example:
        problem = self.field(row, line, "problem", "question")
        answer = str(self.field(row, line, "answer", kind=(str, int)))
        return Example(str(row.get("id", row.get("ID", line))), problem, answer)

    def simple_verdict(self, example: Example, answer_text: str) -> tuple[bool, str | None]:
        extracted = last_boxed(answer_text)
        # AIME answers are integers 0..999: compare as numbers ('033' == '33'), else as MATH strings
        return numeric_match(extracted, example.answer) or math_equal(extracted, example.answer), extracted
