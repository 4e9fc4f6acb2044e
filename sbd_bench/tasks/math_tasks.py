"""GSM8K, MATH500 and AIME from local files (see benchmark_base for the options).

    python -m sbd_bench run --task gsm8k:path=gsm8k_test.jsonl,math500:path=math500.jsonl --solver all

Field layouts (one JSON object per line; the names are those of the public releases; an example's
id is its id field if there is one, else its line number):
  gsm8k    question (str); answer (str whose final number follows '####', as in openai/gsm8k)
  math500  problem (str); answer (str), or else solution (str) holding a \\boxed{} answer;
           optional unique_id / id
  aime     problem or question (str); answer (str or int); optional id
Plain prompts ask for the format the answer is extracted from; chat prompts ask for \\boxed{}.
"""
from __future__ import annotations

from ..types import Example
from . import TaskError, register_task
from .benchmark_base import BenchmarkTask
from .scoring import extract_gsm8k, gsm8k_reference, last_boxed, math_equal, numeric_match

BOX_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


@register_task
class GSM8K(BenchmarkTask):
    name = "gsm8k"
    description = "grade-school math word problems (local file: question, answer with '#### N')"
    layout = "question (str), answer (str ending in '#### N')"
    plain_stop = ("\n\nQuestion:", "\nQuestion:")
    max_new_tokens = 512

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

    def judge(self, example: Example, answer_text: str) -> tuple[bool, dict]:
        extracted = extract_gsm8k(answer_text)
        return numeric_match(extracted, example.answer), {"extracted": extracted}


@register_task
class MATH500(BenchmarkTask):
    name = "math500"
    description = "competition math, last \\boxed{} answer (local file: problem, answer or solution)"
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

    def judge(self, example: Example, answer_text: str) -> tuple[bool, dict]:
        extracted = last_boxed(answer_text)
        return math_equal(extracted, example.answer), {"extracted": extracted}


@register_task
class AIME(MATH500):
    name = "aime"
    description = "AIME problems, integer answer in the last \\boxed{} (local file: problem, answer)"
    layout = "problem or question (str), answer (str or int)"
    max_new_tokens = 4096

    def make_example(self, row: dict, line: int) -> Example:
        problem = self.field(row, line, "problem", "question")
        answer = str(self.field(row, line, "answer", kind=(str, int)))
        return Example(str(row.get("id", row.get("ID", line))), problem, answer)

    def judge(self, example: Example, answer_text: str) -> tuple[bool, dict]:
        extracted = last_boxed(answer_text)
        # AIME answers are integers 0..999: compare as numbers ('033' == '33'), else as MATH strings
        ok = numeric_match(extracted, example.answer) or math_equal(extracted, example.answer)
        return ok, {"extracted": extracted}
