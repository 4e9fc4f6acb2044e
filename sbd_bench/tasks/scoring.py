"""Answer extraction and comparison for the paper's benchmarks (pass@k over several samples is a summary
figure: ``sbd_bench.analysis.metrics.pass_at_k``). Pure string functions, no torch: reports and tests
import this freely. Every function here takes any string a model may write (lone surrogates, NUL bytes,
megabytes, pathological layouts) in time linear in its length and without raising: each regex over
model output has no two quantifiers that can match the same characters one after the other.

    >>> extract_gsm8k("... so she pays 1,200 dollars.\\n#### 1,200")
    '1200'
    >>> last_boxed(r"so \\boxed{\\frac{1}{2}} and not \\boxed{3}")
    '3'
    >>> math_equal(r"\\dfrac{1}{2}", "0.5")
    True
"""
from __future__ import annotations

import re
from fractions import Fraction

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_HUGE_EXPONENT = re.compile(r"[eE][+-]?\d{5}")


# ------------------------------------------------------------------------------------- generic
def cut_at_stop(text: str, stop: tuple[str, ...] | list[str]) -> str:
    """``text`` up to the first occurrence of any stop string (the decoder already cuts there; outputs
    from elsewhere may still hold one, and what follows it is not part of the answer)."""
    cut = min((text.find(s) for s in stop if s and s in text), default=len(text))
    return text[:cut]


def exact_match(prediction: str | None, reference: str) -> bool:
    return prediction is not None and prediction.strip() == reference.strip()


# ------------------------------------------------------------------------------------- numbers
def parse_number(text: str | None) -> Fraction | None:
    """'1,234.50' -> Fraction(2469, 2); '3/4' -> 3/4; '$12' and '12%' -> 12; else None. Exact, so trailing
    zeros and thousands separators do not matter."""
    if text is None:
        return None
    text = text.strip().replace(",", "").replace("$", "").rstrip("%").rstrip(".").strip()
    text = text.replace("\\!", "").replace("{,}", "")
    if _HUGE_EXPONENT.search(text):  # Fraction('1e9999999') would compute 10**9999999: no answer is that
        return None
    try:
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None


def numeric_match(prediction: str | None, reference: str) -> bool:
    a, b = parse_number(prediction), parse_number(reference)
    return a is not None and b is not None and a == b


def last_number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    return found[-1].rstrip(".") if found else None


# --------------------------------------------------------------------------------------- GSM8K
def gsm8k_reference(answer_field: str) -> str:
    """The final number of a GSM8K ``answer`` field: what follows the last ``####``."""
    if "####" not in answer_field:
        raise ValueError("no '####' in the answer")
    number = last_number(answer_field.rsplit("####", 1)[1])
    if number is None:
        raise ValueError("no number after '####'")
    return _canonical_number(number)


def extract_gsm8k(output: str) -> str | None:
    """The model's final number, in this order of preference: the last ``\\boxed{}``, the number after
    the last ``####``, the number after the last 'answer is', the last number anywhere. Commas are
    dropped and trailing zeros normalised ('1,200.00' -> '1200')."""
    boxed = last_boxed(output)
    if boxed is not None and last_number(boxed) is not None:
        return _canonical_number(last_number(boxed))
    lowered = output.lower()
    for marker in ("####", "answer is"):
        at = lowered.rfind(marker)
        found = _NUMBER.search(output, at + len(marker)) if at >= 0 else None
        if found:  # the first number after the last marker, not a later one
            return _canonical_number(found.group(0))
    number = last_number(output)
    return None if number is None else _canonical_number(number)


def _canonical_number(number: str) -> str:
    value = parse_number(number)
    if value is None:
        return number
    if value.denominator == 1:
        return str(value.numerator)
    try:
        short = str(float(value))
    except OverflowError:  # thousands of digits: no float holds it
        return str(value)
    return short if len(short) < 20 else str(value)


# ------------------------------------------------------------------------------------ MATH/AIME
def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces included; None if there
    is none or it is never closed."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    rest = text[start:].split("{", 1)
    if len(rest) < 2:
        tail = text[start + len("\\boxed"):]  # '\boxed 5': the unbraced form
        return tail.split("$")[0].strip() or None if tail.startswith(" ") else None
    depth, body = 1, rest[1]
    for i, ch in enumerate(body):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == 0:
            return body[:i]
    return None


def _strip_text(s: str) -> str:
    return re.sub(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}", r"\1", s)


def _fix_fracs(s: str) -> str:
    # \frac12 -> \frac{1}{2}, \frac1{b} -> \frac{1}{b}
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac(\d)\{", r"\\frac{\1}{", s)
    return re.sub(r"\\frac\{([^{}]*)\}(\d)", r"\\frac{\1}{\2}", s)


def normalize_math(answer: str | None) -> str | None:
    """Hendrycks-style normalisation of a MATH answer string, so that '\\dfrac{1}{2}', '\\frac12' and
    '\\frac{1}{2}' compare equal, as do '10^\\circ' and '10', '\\text{(A)}' and '(A)', 'x = 5' and '5'."""
    if answer is None:
        return None
    s = answer.strip().replace("\n", "").rstrip(".")
    s = s.replace("\\!", "").replace("\\,", "").replace("\\;", "").replace("\\ ", "")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac").replace("\\left", "").replace("\\right", "")
    for unit in ("^{\\circ}", "^\\circ", "\\%", "%", "\\$", "$"):
        s = s.replace(unit, "")
    s = re.sub(r"\\text\{\s*(?:units?|cm|m|km|inches|inch|feet|ft|degrees?|dollars?|cents?)\s*\}", "", s)
    s = _strip_text(s)
    s = s.replace("\\displaystyle", "")
    if re.fullmatch(r"[a-zA-Z]\s*=.*", s):  # 'x = 5' -> '5'
        s = s.split("=", 1)[1]
    s = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)
    s = _fix_fracs(s.replace(" ", ""))
    if s.startswith("."):
        s = "0" + s
    s = s.replace("{,}", "")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", s):
        s = s.replace(",", "")
    if s == "0.5":
        s = "\\frac{1}{2}"
    return s


def _as_fraction(s: str) -> Fraction | None:
    m = re.fullmatch(r"(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}", s)
    if m:
        try:
            value = Fraction(int(m.group(2)), int(m.group(3)))
        except ZeroDivisionError:
            return None
        return -value if m.group(1) else value
    return parse_number(s) if re.fullmatch(r"-?[\d.]+(/\d+)?", s) else None


def math_equal(prediction: str | None, reference: str) -> bool:
    """Normalised string equality, or equal as numbers ('\\frac{1}{2}' == '0.5', '007' == '7')."""
    a, b = normalize_math(prediction), normalize_math(reference)
    if a is None or b is None:
        return False
    if a == b:
        return True
    fa, fb = _as_fraction(a), _as_fraction(b)
    return fa is not None and fb is not None and fa == fb


# ---------------------------------------------------------------------------------------- code
# the language tag, when there is one, then blanks: a tag-less fence's blanks match the first [ \t]* only
_FENCE = re.compile(r"```[ \t]*(?:([\w+-]+)[ \t]*)?\n(.*?)(?:```|\Z)", re.S)


def extract_code(output: str, entry_point: str | None = None) -> str:
    """The program in a model output: the fenced block that defines ``entry_point`` (else the last
    python block, else the last block of any kind); without fences, the output itself."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE.findall(output)]
    if not blocks:
        return output
    if entry_point:
        defining = [b for lang, b in blocks if re.search(rf"\bdef\s+{re.escape(entry_point)}\s*\(", b)]
        if defining:
            return defining[-1]
    python = [b for lang, b in blocks if lang in ("python", "py", "python3")]
    return (python or [b for _, b in blocks])[-1]


def defines(code: str, name: str) -> bool:
    """Does ``code`` define the function ``name`` (at any indentation)? Blanks only within one line:
    ``^\s*`` would run over every following blank line from each line start (quadratic)."""
    return re.search(rf"^[ \t]*def[ \t]+{re.escape(name)}[ \t]*\(", code, re.M) is not None
