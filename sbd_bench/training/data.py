"""Training data as (prompt ids, completion ids + EOS) pairs, in groups: one group per built-in task,
or one for a JSONL file. A JSONL line is either

    {"prompt": "12+3=", "completion": "15"}                     # loss on the completion
    {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}

A chat line is rendered with the tokenizer's chat template and gives one pair per assistant turn: the
conversation up to that turn (with the generation prompt) is the prompt, the turn's tokens up to and
including EOS the completion, split on the rendered text as ``run --chat-template`` renders a prompt
(``chat_pairs``). So the loss falls on assistant tokens only, and each turn's blocks line up with its
first token, as they do when the model decodes that turn. A prompt that already starts with the BOS
token gets no second one (``tasks.encode_prompt``, as in ``run``).

A file is tokenised once: the pairs are cached in the output folder (``tokenized_data.pt``, keyed by
the file's and the tokenizer's bytes) and a resumed or repeated run reads them back. Lines longer than
the model's context (prompt + completion + the last block's padding) are counted and skipped, with one
warning; characters the tokenizer cannot encode (they become ``<unk>``) are counted, with one warning.
"""
from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from .config import TrainError

CACHE_FILE = "tokenized_data.pt"
CACHE_VERSION = 2  # 2: chat lines split on the rendered text, one BOS per prompt


class Pairs:
    """(prompt, completion) id lists stored flat: a file of a million lines stays two tensors."""

    def __init__(self, tokens, prompt_lengths, lengths, lines):
        import torch

        self.tokens, self.prompt_lengths, self.lengths = tokens, prompt_lengths, lengths  # int32, int64, int64
        self.offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
        self.lines = lines  # the source line of each pair (chat lines give several)

    @classmethod
    def from_lists(cls, pairs: list[tuple[list[int], list[int]]], lines: list[int] | None = None) -> "Pairs":
        import torch

        flat = [t for p, c in pairs for t in (*p, *c)]
        return cls(torch.tensor(flat, dtype=torch.int32), torch.tensor([len(p) for p, _ in pairs]),
                   torch.tensor([len(p) + len(c) for p, c in pairs]), lines or list(range(1, len(pairs) + 1)))

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> tuple[list[int], list[int]]:
        row = self.tokens[self.offsets[i]:self.offsets[i + 1]].tolist()
        cut = int(self.prompt_lengths[i])
        return row[:cut], row[cut:]

    def keep(self, which) -> "Pairs":
        """The pairs where the (len,) bool tensor ``which`` is true."""
        import torch

        index = which.nonzero().flatten().tolist()
        rows = [self.tokens[self.offsets[i]:self.offsets[i + 1]] for i in index]
        tokens = torch.cat(rows) if rows else torch.zeros(0, dtype=torch.int32)
        return Pairs(tokens, self.prompt_lengths[which], self.lengths[which], [self.lines[i] for i in index])


def training_groups(data: str, tokenizer, train_examples: int, seed: int, cache_dir: Path | None = None,
                    warn=print) -> list:
    """Groups of pairs. A step draws its whole batch from one group: sequences of one task have
    similar lengths, so the batch wastes little on padding (about half the positions otherwise)."""
    path = Path(data)
    if path.suffix in (".jsonl", ".gz") or path.is_file():
        return [file_pairs(path, tokenizer, cache_dir, warn)]
    from ..tasks import expand_tasks, load_task

    eos = tokenizer.eos_token_id
    groups = []
    for name in expand_tasks(data):
        task = load_task(name)
        if not hasattr(task, "n_train"):
            raise TrainError(f"task '{name}' has no train split: train on the built-in suite tasks or a JSONL file "
                             f"with prompt and completion fields")
        task.n_train, task.seed = train_examples, seed
        groups.append([(task.encode(ex, tokenizer), tokenizer(ex.answer, add_special_tokens=False)["input_ids"] + [eos])
                       for ex in task.examples("train")])
    return groups


def file_pairs(path: Path, tokenizer, cache_dir: Path | None, warn=print) -> Pairs:
    """The pairs of a JSONL file, from the cache when the file and tokenizer are the ones it was made from."""
    import torch

    if not path.is_file():
        raise TrainError(f"data file {path} does not exist: give a JSONL file with prompt/completion (or chat "
                         f"messages) per line, or task names")
    key = _cache_key(path, tokenizer)
    cache = cache_dir / CACHE_FILE if cache_dir is not None else None
    if cache is not None and cache.is_file():
        stored = torch.load(cache, weights_only=False)
        if stored.get("key") == key:
            _warn_unknown(path, stored["unknown"], warn)
            return stored["pairs"]
    pairs, unknown = _tokenize_file(path, tokenizer)
    _warn_unknown(path, unknown, warn)
    if cache is not None:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(".tmp")
        torch.save({"key": key, "pairs": pairs, "unknown": unknown}, tmp)
        tmp.replace(cache)
    return pairs


def _cache_key(path: Path, tokenizer) -> str:
    digest = hashlib.sha256(f"v{CACHE_VERSION}".encode())
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    digest.update((backend.to_str() if backend is not None else repr(tokenizer)).encode())
    digest.update(str((tokenizer.chat_template, tokenizer.eos_token_id, tokenizer.mask_token_id)).encode())
    return digest.hexdigest()


def _tokenize_file(path: Path, tokenizer) -> tuple[Pairs, dict]:
    from ..tasks import encode_prompt, iter_jsonl

    eos = tokenizer.eos_token_id
    pairs, lines, texts = [], [], []
    for number, row in iter_jsonl(path, TrainError):
        both = [name for name in ("prompt", "completion") if name in row]
        if "messages" in row and both:
            raise TrainError(f"{path}:{number}: holds both 'messages' and 'prompt'/'completion', two examples in one "
                             f"line: keep 'messages' (a chat) or {' and '.join(repr(n) for n in both)}, and put the "
                             f"other on a line of its own")
        if "messages" in row:
            turns = chat_pairs(row["messages"], tokenizer, f"{path}:{number}")
            texts.extend(str(m.get("content", "")) for m in row["messages"])
        else:
            prompt, completion = _prompt_completion(row, f"{path}:{number}")
            turns = [(encode_prompt(tokenizer, prompt),
                      tokenizer(completion, add_special_tokens=False)["input_ids"] + [eos])]
            texts.extend((prompt, completion))
        pairs.extend(turns)
        lines.extend([number] * len(turns))
    if not pairs:
        raise TrainError(f"{path} holds no examples: add lines like {{\"prompt\": \"1+1=\", \"completion\": \"2\"}}")
    return Pairs.from_lists(pairs, lines), unknown_characters(texts, pairs, tokenizer, lines)


def _prompt_completion(row: dict, where: str) -> tuple[str, str]:
    for name in ("prompt", "completion"):
        if name not in row:
            raise TrainError(f"{where}: no '{name}' field: training data needs {{\"prompt\": ..., \"completion\": ...}} "
                             f"or {{\"messages\": [...]}} per line")
        if not isinstance(row[name], str):
            raise TrainError(f"{where}: '{name}' is {json.dumps(row[name])[:40]}, not a string: write it "
                             f"as a JSON string (in quotes)")
    if not row["completion"]:
        raise TrainError(f"{where}: 'completion' is empty: there is nothing to learn from that line")
    return row["prompt"], row["completion"]


CHAT_ROLES = ("system", "user", "assistant")


def template_roles(tokenizer) -> set[str]:
    """The roles the chat template names: the quoted words it compares a message's role with
    (``message['role'] == 'tool'``, ``message.role in ['ipython', ...]``), besides ``CHAT_ROLES``."""
    template = str(tokenizer.chat_template)
    roles = set(re.findall(r"""role['"]?\]?\s*[!=]=\s*['"]([\w-]+)['"]""", template))
    roles |= set(re.findall(r"""['"]([\w-]+)['"]\s*[!=]=\s*[\w.\[\]'"]*role\b""", template))
    for listed in re.findall(r"""role['"]?\]?\s+(?:not\s+)?in\s*[\[(]([^\])]*)[\])]""", template):
        roles |= set(re.findall(r"""['"]([\w-]+)['"]""", listed))
    return roles


def check_messages(messages, tokenizer, where: str) -> list[int]:
    """The indices of the assistant turns of a well-formed conversation; one line for what is wrong."""
    if isinstance(messages, list) and not messages:
        raise TrainError(f"{where}: 'messages' is empty: write the conversation, e.g. [{{\"role\": \"user\", "
                         f"\"content\": \"hi\"}}, {{\"role\": \"assistant\", \"content\": \"hello\"}}]")
    if not (isinstance(messages, list) and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages)):
        raise TrainError(f"{where}: 'messages' must be a list of {{\"role\": ..., \"content\": ...}} with string values")
    known = set(CHAT_ROLES) | (template_roles(tokenizer) if getattr(tokenizer, "chat_template", None) else set())
    for number, message in enumerate(messages, start=1):
        if message["role"] not in known:
            names = ", ".join(CHAT_ROLES + tuple(sorted(known - set(CHAT_ROLES))))
            raise TrainError(f"{where}: message {number} has the role {message['role']!r}, which is not one of {names} "
                             f"(the chat template's roles): fix its name")
        if message["role"] == "assistant" and not message["content"]:
            raise TrainError(f"{where}: the assistant's message {number} is empty: there is nothing to learn from it; "
                             f"give it content or drop it")
    assistant = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    if not assistant:
        raise TrainError(f"{where}: no assistant turn in 'messages': the loss falls on assistant turns only, so "
                         f"the line teaches nothing; add {{\"role\": \"assistant\", \"content\": ...}}")
    if not getattr(tokenizer, "chat_template", None):
        raise TrainError(f"{where}: a chat line needs the model's chat template, and this tokenizer has none: "
                         f"fine-tune a model whose tokenizer has one (--base), or write prompt/completion lines")
    return assistant


def chat_pairs(messages, tokenizer, where: str) -> list[tuple[list[int], list[int]]]:
    """One (conversation so far + generation prompt, assistant turn up to EOS) pair per assistant turn.

    The split is made on the rendered text, as ``run --chat-template`` renders a prompt (the template as
    text, then tokenised: ``tasks.encode_chat``): the prompt is the text of the conversation so far with
    the generation prompt, tokenised alone; the completion the rest of the turn's text, tokenised alone.
    Splitting token lists instead breaks where a BPE merges across the boundary (a byte-level BPE with
    the GPT-2 pattern writes a generation prompt's final "\\n\\n" as one token, but "\\n\\n" before a
    word as two): the model would learn to follow a prompt that ``run`` never gives it."""
    assistant = check_messages(messages, tokenizer, where)
    eos = tokenizer.eos_token_id
    pairs = []
    for i in assistant:
        prompt = _render(tokenizer, messages[:i], True, where)
        full = _render(tokenizer, messages[:i + 1], False, where)
        if not full.startswith(prompt) or len(full) == len(prompt):
            raise TrainError(f"{where}: the chat template does not render turn {i + 1} as a continuation of the "
                             f"conversation before it (it rewrites earlier turns), so its text cannot be told "
                             f"apart; split the conversation into one line per assistant turn")
        completion = tokenizer(full[len(prompt):], add_special_tokens=False)["input_ids"]
        completion = completion[:completion.index(eos) + 1] if eos in completion else completion + [eos]
        pairs.append((tokenizer(prompt, add_special_tokens=False)["input_ids"], completion))
    return pairs


def _render(tokenizer, messages, generation_prompt: bool, where: str) -> str:
    from ..tasks import render_chat

    try:
        return render_chat(tokenizer, messages, generation_prompt)
    except Exception as exc:  # a template's own raise_exception() (e.g. roles must alternate)
        raise TrainError(f"{where}: the chat template refused the conversation: {str(exc).splitlines()[0][:160]}") from None


def unknown_characters(texts: list[str], pairs, tokenizer, lines: list[int]) -> dict:
    """How many tokens became the tokenizer's unknown token, in which lines, and which characters did."""
    unk = tokenizer.unk_token_id
    if unk is None:
        return {"tokens": 0, "lines": [], "characters": ""}
    bad_lines = sorted({line for (p, c), line in zip(pairs, lines) if unk in p or unk in c})
    count = sum(p.count(unk) + c.count(unk) for p, c in pairs)
    chars = "".join(sorted({ch for text in texts for ch in set(text)
                            if unk in tokenizer(ch, add_special_tokens=False)["input_ids"]}))
    return {"tokens": count, "lines": bad_lines, "characters": chars}


def _warn_unknown(path: Path, unknown: dict, warn) -> None:
    if unknown["tokens"]:
        lines = unknown["lines"]
        shown = ", ".join(map(str, lines[:5])) + (" ..." if len(lines) > 5 else "")
        chars = f" ({unknown['characters'][:20]!r})" if unknown["characters"] else ""
        warn(f"warning: {path}: {unknown['tokens']} token(s) in {len(lines)} line(s) (lines {shown}) are characters "
             f"the tokenizer cannot encode{chars}; they train as its unknown token")


def fit_to_context(groups, block_size: int, max_positions: int | None, from_file: bool, warn=print):
    """Drop (file) or refuse (built-in task) pairs longer than the model's context."""
    if max_positions is None:
        return groups
    if block_size > max_positions:
        raise TrainError(f"--block-size {block_size} is larger than the model's sequence length "
                         f"(max_position_embeddings={max_positions}): use a block size <= {max_positions}")
    if from_file:
        import torch

        pairs = groups[0]
        need = _padded_lengths(pairs, block_size)
        fits = need <= max_positions
        if not bool(fits.any()):
            raise TrainError(f"no line of the data fits the model's {max_positions} positions (prompt + completion "
                             f"+ up to {block_size - 1} of block padding; the shortest needs {int(need.min())}): "
                             f"shorten the data or lower --block-size")
        if not bool(fits.all()):
            dropped = [pairs.lines[i] for i in (~fits).nonzero().flatten().tolist()]
            shown = ", ".join(map(str, sorted(set(dropped))[:5])) + (" ..." if len(set(dropped)) > 5 else "")
            warn(f"warning: skipped {len(dropped)} of {len(pairs)} example(s) longer than the model's {max_positions} "
                 f"positions with the last block padded (lines {shown}); trained on the {int(fits.sum())} others")
            return [pairs.keep(fits)]
        return groups
    worst = max(len(p) + len(c) + block_size - 1 for pairs in groups for p, c in pairs)  # last block padded
    if worst > max_positions:
        raise TrainError(f"a training sequence needs {worst} positions (prompt + completion + block padding) but the "
                         f"model holds {max_positions}: shorten the data, lower --block-size or raise --max-positions")
    return groups


def _padded_lengths(pairs: Pairs, block_size: int):
    """The most positions each pair can take: its last block padded (by k - 1 <= block_size - 1)."""
    return pairs.lengths + block_size - 1
