"""ParallelBench's tasks from a local clone (tasks/parallelbench.py): each rule check's boundary, the prompts
as ParallelBench builds them, every refusal in one line, and a run of the 12 with PB and AUP in its report.
The clone here is tests/data/parallelbench: files of our own in ParallelBench's layout (never its data)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sbd_bench.tasks import TaskError, expand_tasks, load_task
from sbd_bench.tasks import parallelbench as pb

ROOT = Path(__file__).resolve().parent.parent
CLONE = ROOT / "tests" / "data" / "parallelbench"
WL = CLONE / pb.DATA / "waiting_line"
Q = ["Ada Byron", "Alan Kay", "Grace Hopper"]


def listed(names) -> str:
    return "[" + ", ".join(f'"{n}"' for n in names) + "]"


# ------------------------------------------------------------------------------------------ the rules
def test_list_reading_takes_the_last_bracketed_list_leniently():
    assert pb.parse_list('Sure! [x] The line is now: ["Ada Byron", "Alan Kay"] done') == ["Ada Byron", "Alan Kay"]
    assert pb.parse_list("Ada Byron, Alan Kay,") == ["Ada Byron", "Alan Kay"]  # no brackets: still a list
    assert pb.parse_list("[]") == []


def test_list_match_needs_the_exact_list():
    assert pb.list_match(listed(Q), listed(Q))
    assert not pb.list_match(listed(Q[:2]), listed(Q)) and not pb.list_match(listed(Q[::-1]), listed(Q))


def test_shuffle_is_the_same_people_in_another_order():
    answer = {"input": Q}
    assert pb.list_shuffle(listed([Q[1], Q[0], Q[2]]), answer)
    assert not pb.list_shuffle(listed(Q), answer)  # the same order is no shuffle
    assert not pb.list_shuffle(listed([Q[1], Q[0]]), answer)  # someone lost
    assert not pb.list_shuffle(listed([Q[1], Q[0], Q[2], Q[2]]), answer)  # someone twice


def test_random_insert_puts_the_new_person_anywhere_and_keeps_the_rest():
    answer = {"input": Q, "word": "Radia Perlman"}
    for at in range(4):
        assert pb.list_random_insert(listed(Q[:at] + ["Radia Perlman"] + Q[at:]), answer)
    assert not pb.list_random_insert(listed(Q), answer)  # not inserted
    assert not pb.list_random_insert(listed(["Radia Perlman", Q[1], Q[0], Q[2]]), answer)  # the rest reordered
    assert pb.list_random_insert(listed(Q + ["Dennis Ritchie"]), {"input": Q, "word": None})  # anyone new


def test_random_remove_takes_exactly_one_out():
    answer = {"input": Q}
    assert pb.list_random_remove(listed([Q[0], Q[2]]), answer)
    assert not pb.list_random_remove(listed(Q), answer) and not pb.list_random_remove(listed([Q[0]]), answer)
    assert not pb.list_random_remove(listed([Q[2], Q[0]]), answer)  # order changed
    assert not pb.list_random_remove(listed([Q[0], "Ken Thompson"]), answer)  # replaced, not removed


def test_random_replace_swaps_one_person_for_the_new_one():
    answer = {"input": Q, "word": "Radia Perlman"}
    assert pb.list_random_replace(listed([Q[0], "Radia Perlman", Q[2]]), answer)
    assert not pb.list_random_replace(listed(Q), answer)  # the new person missing
    assert not pb.list_random_replace(listed(["Radia Perlman", "Radia Perlman", Q[2]]), answer)  # two replaced
    assert not pb.list_random_replace(listed([Q[0], "Radia Perlman"]), answer)  # one lost


def test_latin_square_boundaries():
    answer = {"symbols": ["A", "B", "C", "D"]}
    square = "A,B,C,D\nB,C,D,A\nC,D,A,B\nD,A,B,C"
    assert pb.latin_square(square, answer)
    assert pb.latin_square("Here it is:\n" + square.replace(",", ", ") + "\nDone.", answer)  # chatter and spaces
    assert not pb.latin_square(square.replace("B,C,D,A", "B,C,D,D"), answer)  # one repeated symbol in a row
    assert not pb.latin_square("A,B,C,D\nB,A,D,C\nC,D,A,B\nA,B,C,D", answer)  # a column repeats a symbol
    assert not pb.latin_square("\n".join(square.split("\n")[:3]), answer)  # three rows
    assert not pb.latin_square("I cannot do that.", answer)  # no row at all
    assert not pb.latin_square(square, {**answer, "first_row": ["B", "C", "D", "A"]})  # the given first row


def test_sudoku_is_the_gold_grid_read_leniently():
    gold = "1243\n3421\n4312\n2134"
    assert pb.sudoku(gold, gold) and pb.sudoku("1 2 4 3\n3,4,2,1\n\n4312\n2134\n", gold)
    assert not pb.sudoku(gold.replace("2134", "2143"), gold)  # one cell wrong
    assert not pb.sudoku("1243\n3421\n4312", gold)  # three rows


# -------------------------------------------------------------------------------------- the tasks
def test_the_pack_names_the_12_rule_checked_tasks_and_a_group_its_own():
    names = expand_tasks(f"parallelbench:root={CLONE}")
    assert len(names) == 12 and all(n.endswith(f":root={CLONE}") for n in names)
    assert [n.split(":")[0] for n in names] == [f"parallelbench/{t}" for t in pb.RULE_TASKS]
    assert expand_tasks("parallelbench/puzzle:root=X") == ["parallelbench/puzzle/latin_square_n4:root=X",
                                                           "parallelbench/puzzle/sudoku_n4_12:root=X"]


def test_prompts_are_built_as_parallelbench_builds_them():
    task = load_task(f"parallelbench/waiting_line/insert_index:root={CLONE}")
    config = pb.read_config(WL / "task_config.yaml", "waiting_line/insert_index")
    row = json.loads((WL / "insert_index.jsonl").read_text().splitlines()[0])
    [first, *_] = task.examples()
    icl = row["input"]["icl_examples"][0]
    assert first.meta["messages"] == [
        {"role": "user", "content": config["prompt"].format(**icl["input"])},
        {"role": "assistant", "content": icl["answer"]},
        {"role": "user", "content": config["prompt"].format(**row["input"])}]
    assert task.max_new_tokens == 32 and task.verdict(first, "OK: " + row["answer"])[0]
    sudoku = load_task(f"parallelbench/puzzle/sudoku_n4_12:root={CLONE}")
    assert sudoku.max_new_tokens == 64
    query = sudoku.examples()[0].meta["messages"][-1]["content"]
    assert "\\n" not in query and "1200\n3400\n0012\n0034" in query  # the literal \n of the prompt: a newline
    shuffle = load_task(f"parallelbench/waiting_line/shuffle:root={CLONE}")
    assert shuffle.examples()[0].meta["messages"][1]["content"].startswith("[")  # the ICL answer's example


def test_text_writing_tasks_are_refused_naming_what_they_need():
    with pytest.raises(TaskError, match="LanguageTool's grammar check .Java 17"):
        load_task(f"parallelbench/words_to_sentence/easy:root={CLONE}")
    with pytest.raises(TaskError, match="ROUGE-L"):
        load_task(f"parallelbench/paraphrase_summarize/samsum:root={CLONE}")


def clone_copy(tmp_path: Path) -> Path:
    return Path(shutil.copytree(CLONE, tmp_path / "clone"))


def test_a_clone_at_another_commit_or_without_the_files_is_refused(tmp_path):
    with pytest.raises(TaskError, match="root=DIR"):
        load_task("parallelbench/waiting_line/copy")
    with pytest.raises(TaskError, match="is not a folder: clone it there"):
        load_task(f"parallelbench/waiting_line/copy:root={tmp_path / 'nowhere'}")
    clone = clone_copy(tmp_path)
    (clone / ".git" / "refs" / "heads").mkdir(parents=True)
    (clone / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (clone / ".git" / "refs" / "heads" / "main").write_text("4c21635" + "0" * 33 + "\n")
    with pytest.raises(TaskError, match="at commit 4c21635, not 72de8f7.*checkout 72de8f7"):
        load_task(f"parallelbench/waiting_line/copy:root={clone}")
    (clone / ".git" / "refs" / "heads" / "main").write_text(pb.PINNED_COMMIT + "\n")
    assert len(load_task(f"parallelbench/waiting_line/copy:root={clone}").examples()) == 2
    shutil.rmtree(clone / pb.DATA / "puzzle")
    with pytest.raises(TaskError, match="task_config.yaml does not exist"):
        load_task(f"parallelbench/puzzle/sudoku_n4_12:root={clone}")
    shutil.rmtree(clone / pb.DATA)
    with pytest.raises(TaskError, match="has no dataset/parallel_bench/data/output/test"):
        load_task(f"parallelbench/waiting_line/copy:root={clone}")


@pytest.mark.parametrize("task, line, says", [
    ("shuffle", {"input": {"context": "[]"}, "answer": "[]"}, "'answer' must be an object with input"),
    ("copy", {"input": {"text": "x"}, "answer": "[]"}, "'input' lacks the field 'context'"),
    ("copy", {"answer": "[]"}, "'input' must be an object"),
    ("copy", {"input": {"context": "[]", "icl_examples": [{"input": {"context": "[]"}}]}, "answer": "[]"},
     "each of 'icl_examples' must be an object with 'input' and 'answer'"),
])
def test_a_malformed_record_names_its_file_and_line(tmp_path, task, line, says):
    clone = clone_copy(tmp_path)
    path = clone / pb.DATA / "waiting_line" / f"{task}.jsonl"
    path.write_text(path.read_text() + json.dumps(line) + "\n")
    with pytest.raises(TaskError, match=f"{task}.jsonl:3: {says}".replace("(", r"\(")):
        load_task(f"parallelbench/waiting_line/{task}:root={clone}")


def test_a_bad_root_is_one_line_and_exit_2_from_a_real_process(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "sbd_bench", "run", "--model", "sbd-tiny", "--task",
                           f"parallelbench:root={tmp_path / 'nowhere'}", "--out", str(tmp_path / "run")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("error: ") and "nowhere is not a folder" in done.stderr
    assert not (tmp_path / "run").exists()


def test_a_run_of_the_pack_reports_pb_and_aup_over_12_of_17(tiny_models, tmp_path):
    from sbd_bench.cli import main

    out = tmp_path / "run"
    assert main(["run", "--model", str(tiny_models["llama"]), "--task", f"parallelbench:root={CLONE}",
                 "--solver", "fixed_k:k=2", "--block-size", "4", "--max-new-tokens", "8", "--limit", "1",
                 "--out", str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    yardsticks = summary["yardsticks"]
    assert len(yardsticks["pb_tasks"]) == 12 and yardsticks["pb_tasks_of"] == 17
    assert set(yardsticks["pb"]) == {"ntp", "fixed_k"} and set(yardsticks["pb"]["ntp"]) == {"PB90", "PB80", "PB70", "PB60"}
    assert {(e["family"], e["task"]) for e in yardsticks["aup"]} == {
        (f, f"parallelbench/{t}") for f in ("ntp", "fixed_k") for t in pb.RULE_TASKS}
    text = (out / "report.md").read_text()
    assert "over the 12 of ParallelBench's 17 tasks" in text and "| PB90 | PB80 | PB70 | PB60 |" in text
