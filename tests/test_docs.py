"""The documentation holds together: every link between the README, docs/ and the model cards reaches a
file (and, for `#anchor`, a heading of it, by GitHub's slug rules), and every `python -m sbd_bench ...`
command written in them is accepted by the CLI's parser (nothing is run)."""
from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
import unicodedata
from pathlib import Path

import pytest

from sbd_bench.cli import build_parser

ROOT = Path(__file__).resolve().parent.parent


def doc_files(root: Path = ROOT) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").glob("*.md")), *sorted(root.glob("models/*/README.md"))]


FENCE = re.compile(r"^ {0,3}(```|~~~)[^\n]*\n.*?^ {0,3}\1[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+)(.+?)(?<!`)\1(?!`)", re.S)
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def prose(text: str) -> str:
    """The text without code blocks and code spans (a link written inside code is no link)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: the rendered text (code spans keep their text, links their label,
    emphasis markers go) lower-cased, every character that is not a letter, mark, number, `_`, `-` or a
    space dropped, spaces made hyphens (github-slugger)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    parts = re.split(r"(`+[^`]*`+)", text)  # inside code spans `*` and `_` are text
    text = "".join(p.strip("`") if p.startswith("`") else re.sub(r"(\*+|(?<!\w)_+|_+(?!\w))", "", p) for p in parts)
    kept = (c for c in text.lower() if c in " -_" or unicodedata.category(c)[0] in "LMN")
    return "".join(kept).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a Markdown file offers: its headings' slugs (repeats numbered -1, -2, ... as GitHub
    does) and explicit `id=`/`name=` attributes."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    text = FENCE.sub("", path.read_text())
    for heading in re.findall(r"^ {0,3}#{1,6}[ \t]+(.+?)[ \t#]*$", text, re.M):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    found |= set(re.findall(r"""(?:id|name)=["']([^"']+)["']""", text))
    return found


def broken_links(files: list[Path], root: Path = ROOT) -> list[str]:
    problems = []
    for doc in files:
        for target in LINK.findall(prose(doc.read_text())):
            if re.match(r"[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...: not ours
                continue
            file_part, _, anchor = target.partition("#")
            dest = (doc.parent / file_part).resolve() if file_part else doc
            where = f"{doc.relative_to(root)}: ({target})"
            if not dest.exists():
                problems.append(f"{where}: no file {file_part}")
            elif not dest.resolve().is_relative_to(root):
                problems.append(f"{where}: outside the repository")
            elif anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
                problems.append(f"{where}: no heading with anchor #{anchor} in {dest.relative_to(root)}")
    return problems


# -- commands ---------------------------------------------------------------------------------------

COMMAND = re.compile(r"-m sbd_bench(?![\w.])")
ELLIPSIS = {"...", "…"}


def code_texts(text: str) -> list[str]:
    """The code in a Markdown text: each fenced block and each code span, with shell line continuations
    joined (a code span may wrap over lines in the source, like any prose)."""
    blocks = [m.group(0).split("\n", 1)[1].rsplit("\n", 1)[0] for m in FENCE.finditer(text)]
    spans = [m.group(2).replace("\n", " ") for m in CODE_SPAN.finditer(FENCE.sub("", text))]
    return [re.sub(r"\\\n", " ", t) for t in blocks + spans]


def sbd_commands(code: str) -> list[list[str]]:
    """The argument lists of every `python -m sbd_bench` (or `torchrun ... -m sbd_bench`) command in a
    piece of shell: each ends at the end of its line, at a comment, or at `&&`, `||`, `|`, `;` or a
    redirection; a command written inside a comment is read too (`# = python -m sbd_bench run ...`)."""
    commands = []
    for line in code.splitlines():
        for match in COMMAND.finditer(line):
            lexer = shlex.shlex(line[match.end():], posix=True, punctuation_chars=True)
            lexer.whitespace_split, lexer.commenters = True, "#"
            args = []
            try:
                for token in lexer:
                    if token and set(token) <= set("();<>|&"):
                        if token[0] in "<>" and args and args[-1].isdigit():
                            args.pop()  # the `2` of `2>&1`
                        break
                    args.append(token)
            except ValueError as exc:  # an unclosed quote
                raise AssertionError(f"cannot split {line!r}: {exc}") from None
            args = [a for a in args if a not in ELLIPSIS]  # `run --model M ...`: more flags, elided
            if args:
                commands.append(args)
    return commands


def parse_error(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    """What argparse says against these arguments, or None when it accepts them."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            parser.parse_args(args)
    except SystemExit as exc:
        if exc.code not in (0, None):
            return err.getvalue().strip().splitlines()[-1]
    return None


def bad_commands(files: list[Path], root: Path = ROOT) -> list[str]:
    parser = build_parser()
    problems = []
    for doc in files:
        for code in code_texts(doc.read_text()):
            for args in sbd_commands(code):
                error = parse_error(parser, args)
                if error:
                    problems.append(f"{doc.relative_to(root)}: python -m sbd_bench {shlex.join(args)}: {error}")
    return problems


# -- the tests --------------------------------------------------------------------------------------

def test_every_link_resolves():
    assert not broken_links(doc_files()), "\n".join(broken_links(doc_files()))


def test_every_command_parses():
    commands = [args for doc in doc_files() for code in code_texts(doc.read_text()) for args in sbd_commands(code)]
    subcommands = {args[0] for args in commands}
    assert {"run", "list", "train", "report", "compare", "roofline", "throughput"} <= subcommands, subcommands
    problems = bad_commands(doc_files())
    assert not problems, "\n".join(problems)


def test_readme_is_a_front_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    pages = sorted(p.name for p in (ROOT / "docs").glob("*.md"))
    mapped = re.findall(r"^- \[[^\]]+\]\(docs/([\w.-]+\.md)\)", readme.partition("## The reference")[2], re.M)
    assert not set(pages) - set(mapped), f"add a line for each to the README's map of docs/: {set(pages) - set(mapped)}"
    assert sorted(mapped) == pages, "one line per docs/ page on the README's map, each page once"


def test_ci_runs_the_readme_commands():
    """CI (.ci/run) installs as the README's first block says and runs its test command."""
    block = FENCE.search((ROOT / "README.md").read_text()).group(0)
    lines = [line.split("  #")[0].strip() for line in block.splitlines()[1:-1] if not line.startswith("#")]
    install, tests = lines[0].split(" && ")[0], lines[1]
    assert install == 'pip install -c constraints.txt -e ".[test]"' and tests == "python -m pytest", lines
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert f"python -m pip install -q {install.removeprefix('pip install ')}" in ci and tests in ci


def test_documented_commands_write_under_runs():
    """The docs' commands never write into the committed results/ (`throughput` overwrote a JSON there)."""
    commands = [args for doc in doc_files() for code in code_texts(doc.read_text()) for args in sbd_commands(code)]
    outs = [args[args.index("--out") + 1] for args in commands
            if args[0] in ("run", "throughput", "train") and "--out" in args[:-1]]
    assert outs and not [out for out in outs if out.startswith("results/")], outs


# -- the checks themselves fail when they should ----------------------------------------------------

@pytest.mark.parametrize("heading, anchor", [
    ("Verified decoding: output equal to NTP", "verified-decoding-output-equal-to-ntp"),
    ("Running the paper's benchmarks", "running-the-papers-benchmarks"),
    ("The fast GPU path: `--fast` / `--no-fast`, `--compile` / `--no-compile`",
     "the-fast-gpu-path---fast----no-fast---compile----no-compile"),
    ("Batching: `--batch-size N`", "batching---batch-size-n"),
    ("Regression tracking: `compare`", "regression-tracking-compare"),
    ("The `ntp_vs_generate` check — *fast*", "the-ntp_vs_generate-check--fast"),
    ("Stops — γ ≥ 0 [link](x.md)", "stops--γ--0-link"),
])
def test_slug_follows_github(heading, anchor):
    assert slug(heading) == anchor


def test_a_broken_link_or_flag_is_found(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# Page A\n## Two words\n## Two words\n")
    readme = tmp_path / "README.md"
    readme.write_text(
        "[ok](docs/a.md) [ok](docs/a.md#two-words-1) [ok](#top) [web](https://example.com/x)\n"
        "`[not a link](nowhere.md)`\n"
        "[gone](docs/b.md) [bad anchor](docs/a.md#three-words) [bad local](#nothing)\n# Top\n"
        "```bash\n"
        "OMP_NUM_THREADS=1 python -m sbd_bench run --solver all --threads 1 \\\n    --limit 3 2>&1 | tail -3\n"
        "python -m sbd_bench list && python -m sbd_bench run --no-such-flag   # python -m sbd_bench report R\n"
        "torchrun --nproc-per-node 2 -m sbd_bench run --out runs/x; python -m sbd_bench compare A\n"
        "```\n"
        "and `python -m sbd_bench run --resume runs/…` or `python -m sbd_bench run --limit\nmany`\n")
    links = broken_links([readme], root=tmp_path)
    assert len(links) == 3 and all(s in "\n".join(links) for s in ("no file docs/b.md", "#three-words", "#nothing"))
    commands = [args for code in code_texts(readme.read_text()) for args in sbd_commands(code)]
    assert ["run", "--solver", "all", "--threads", "1", "--limit", "3"] in commands
    assert ["report", "R"] in commands and ["run", "--out", "runs/x"] in commands
    problems = bad_commands([readme], root=tmp_path)
    assert len(problems) == 3, problems
    assert "--no-such-flag" in problems[0] and "compare A" in problems[1] and "invalid int value: 'many'" in problems[2]
