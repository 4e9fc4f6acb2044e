"""report.html: built from the records alone, self-contained, and working in a real browser (headless
Chromium): no console error, no request leaving the file, the leaderboard's numbers equal
summary.json's and sort on a click, the plot names a point on hover, a traced example's decoding steps
forward. The browser tests skip only where Chromium is missing locally; CI (.ci/run) installs it and
fails rather than skips. Also: traces.jsonl read and checked against its records (trace_fixtures.py)."""
from __future__ import annotations

import copy
import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

import trace_fixtures as tf
from measure_fixtures import crafted_run, standard_records
from sbd_bench.analysis import page
from sbd_bench.analysis.metrics import summarize
from sbd_bench.analysis.records import RunFolderError, load_run
from sbd_bench.analysis.report import ordered, write_report
from sbd_bench.analysis.traces import read_traces, trace_problems
from sbd_bench.analysis.yardsticks import annotate
from sbd_bench.cli import main

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("report_browser", ROOT / "scripts" / "report_browser.py")
browser = importlib.util.module_from_spec(spec)
spec.loader.exec_module(browser)


def embedded(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    payload = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', text, re.S).group(1)
    return json.loads(payload)


def write_run_page(run_dir: Path, out_dir: Path) -> Path:
    """report.html of a run folder, without the PNGs (what `report` does for the page, faster)."""
    summary, records = load_run(run_dir)
    rows = ordered(summarize(records))
    annotate(rows, records)  # as report.py does: each row's family AUP
    return page.write_page(out_dir, run_dir.name, summary, records, rows, read_traces(run_dir / "traces.jsonl"))


# ------------------------------------------------------------------------------------- no browser
def test_page_is_one_file_holding_the_rows(tmp_path):
    run = crafted_run(tmp_path / "run", standard_records())
    write_report(run)
    path = run / "report.html"
    text = path.read_text(encoding="utf-8")
    # nothing to fetch: no external script, style sheet, font, image or frame, and a policy that refuses them
    assert not re.search(r"<(link|iframe|img)\b|\bsrc=|@import|url\(", text)
    assert "default-src 'none'" in text
    data = embedded(path)
    rows = ordered(summarize(standard_records()))
    annotate(rows, standard_records())
    assert [(data["tasks"][r["task"]], data["configs"][r["config"]]["name"]) for r in data["rows"]] == \
        [(r["task"], r["config"]) for r in rows]
    for shown, row in zip(data["rows"], rows):
        assert shown["values"] == {c["key"]: row.get(c["key"]) for c in data["columns"]}
    assert [c["name"] for c in data["configs"] if c["ntp"]] == ["ntp"]
    assert "Interactive: [report.html](report.html)" in (run / "report.md").read_text()


def test_configurations_marked_verified_and_sampled(tmp_path):
    records = standard_records(tasks=("arith",), n=3)
    for r in copy.deepcopy(records):
        label = "ntp:temperature=0.7" if r["solver"] == "ntp" else r["config"] + ",temperature=0.7"
        records.append({**r, "config": label, "params": {"temperature": 0.7}, "sample": 0, "seed": 1})
    for r in records:
        if r["config"] == "fixed_k:k=4":
            r["config"], r["params"] = "fixed_k:k=4,verify=on", {"k": 4, "verify": "on"}
    rows = ordered(summarize(records))
    data = page.page_data("x", {"provenance": {}}, records, rows, [])
    configs = {c["name"]: c for c in data["configs"]}
    assert configs["fixed_k:k=4,verify=on"]["verified"] and not configs["fixed_k:k=4,verify=on"]["sampled"]
    assert configs["ntp:temperature=0.7"]["sampled"] and configs["ntp:temperature=0.7"]["ntp"]
    # each output is set against NTP's at its own sampling settings
    names = [c["name"] for c in data["configs"]]
    assert names[configs["fixed_k:k=4,temperature=0.7"]["base"]] == "ntp:temperature=0.7"
    assert names[configs["fixed_k:k=4,verify=on"]["base"]] == "ntp"


def test_outputs_past_the_budget_show_verdicts_only(tmp_path, monkeypatch):
    run = tf.traced_run(tmp_path / "run")
    summary, records = load_run(run)
    rows = ordered(summarize(records))
    monkeypatch.setattr(page, "OUTPUT_BUDGET", 1)  # nothing fits: only the traced example keeps its outputs
    data = page.page_data("run", summary, records, rows, read_traces(run / "traces.jsonl"))
    full = {ex["id"]: ex["full"] for ex in data["examples"]["copy"]}
    assert full == {"0": True, "1": False, "2": False} and data["omitted"] == 2
    assert all(cell[5] is None for ex in data["examples"]["copy"][1:] for cell in ex["cells"])
    assert data["examples"]["copy"][1]["cells"][0][:5] == [True, 5, 5, 1, 1]  # verdicts and counts stay


def test_hand_written_traces_add_up_to_their_records(tmp_path):
    run = tf.traced_run(tmp_path / "run")
    traces = read_traces(run / "traces.jsonl")
    records = {r["config"]: r for r in tf.traced_records() if r["id"] == "0"}
    assert [t["config"] for t in traces] == list(tf.FORWARDS)
    for trace in traces:
        assert trace_problems(trace, records[trace["config"]]) == [], trace["config"]
    verified = next(t for t in traces if t["config"] == tf.VERIFIED)
    assert sum(f["accepted"] for f in verified["forwards"] if f["kind"] == "verify") == \
        sum(records[tf.VERIFIED]["accepted_per_block"])
    # a trace that disagrees with its record says how
    broken = copy.deepcopy(verified)
    broken["forwards"][1]["accepted"] = 3
    broken["forwards"][1]["rejected_slot"] = None
    assert any("drafts judged per block" in p for p in trace_problems(broken, records[tf.VERIFIED]))
    blocks = copy.deepcopy(next(t for t in traces if t["config"] == tf.BLOCKS))
    blocks["forwards"][0]["revealed"] = [0]
    problems = trace_problems(blocks, records[tf.BLOCKS])
    assert problems == ["tokens per forward [1, 2, 2, 2, 2, 1] are not the record's revealed_per_forward "
                        "[2, 2, 2, 2, 2, 1]"]
    assert "committed tokens" in trace_problems({**blocks, "forwards": blocks["forwards"][:-1]}, records[tf.BLOCKS])[1]


@pytest.mark.parametrize("line, says", [
    ('{"task": "copy"', "is not valid JSON: the traces are damaged"),
    ('{"task": "copy", "id": "0", "config": "ntp", "block_size": 4, "pieces": {}}', "lacks forwards"),
    (None, "forward 2 field 'kind' is \"draft\""),
])
def test_damaged_trace_line_is_one_clear_error(tmp_path, capsys, line, says):
    run = tf.traced_run(tmp_path / "run")
    lines = (run / "traces.jsonl").read_text().splitlines()
    if line is None:
        trace = json.loads(lines[1])
        trace["forwards"][1]["kind"] = "draft"
        line = json.dumps(trace)
    (run / "traces.jsonl").write_text("\n".join([lines[0], line, *lines[2:]]) + "\n")
    with pytest.raises(RunFolderError):
        read_traces(run / "traces.jsonl")
    assert main(["report", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"traces.jsonl:2" in err and says in err, err
    assert not (run / "report.md").exists()  # refused before anything was written


# ------------------------------------------------------------------------------------ the browser
@pytest.fixture(scope="module")
def driver():
    why = browser.missing()
    if why:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser tests: {why} (.ci/run installs it)")
        pytest.skip(why)
    d = browser.open_browser()
    yield d
    browser.close_browser(d)


@pytest.fixture(scope="module")
def baseline_page(tmp_path_factory):
    return write_run_page(ROOT / "results" / "baseline", tmp_path_factory.mktemp("baseline"))


@pytest.fixture(scope="module")
def traced_page(tmp_path_factory):
    run = tf.traced_run(tmp_path_factory.mktemp("traced") / "run")
    return write_run_page(run, run)


def page_problems(driver, path: Path) -> list[str]:
    """What a person would notice at once: errors in the console, requests leaving the file, no page."""
    browser.load(driver, path)
    problems = [f"console: {m}" for m in browser.console_errors(driver)]
    problems += [f"request: {u}" for u in browser.outside_requests(browser.requests_made(driver), path)]
    if not driver.execute_script("return !!(window.sbdReport && window.sbdReport.ready)"):
        problems.append("the page's script did not finish drawing it")
    return problems


def css(driver, selector):
    return driver.find_elements("css selector", selector)


def test_every_row_shows_summary_json_figures(driver, baseline_page):
    assert page_problems(driver, baseline_page) == []
    summary = json.loads((ROOT / "results" / "baseline" / "summary.json").read_text())
    if "aup" not in summary["rows"][0]:  # a baseline summarised before AUP: the one definition adds its fields
        annotate(summary["rows"], load_run(ROOT / "results" / "baseline")[1])
    columns = [(key, text) for key, _, text, _, _ in page.columns_of(summary["rows"])]
    assert {"aup", "aup_y_max"} <= {key for key, _ in columns}
    read = """return [...document.querySelectorAll('#board tbody tr')].map((tr) => [tr.dataset.config,
        Object.fromEntries([...tr.querySelectorAll('td[data-value]')].map((td) => [td.dataset.key,
            [td.dataset.value, td.querySelector('.value').textContent]]))]);"""
    seen = 0
    for task in dict.fromkeys(r["task"] for r in summary["rows"]):
        css(driver, f'#tasks button[data-task="{task}"]')[0].click()
        shown = dict(driver.execute_script(read))  # config -> {column: [data-value, text shown]}
        rows = [r for r in summary["rows"] if r["task"] == task]
        assert sorted(shown) == sorted(r["config"] for r in rows)
        for row in rows:
            for key, text in columns:
                value, written = shown[row["config"]][key]
                assert (None if value == "" else json.loads(value)) == row.get(key), (task, row["config"], key)
                assert written == text(row.get(key)), (task, row["config"], key)
            seen += 1
    assert seen == len(summary["rows"]) >= 36  # every row of the committed baseline (56 and more)
    assert browser.console_errors(driver) == []


def test_leaderboard_sorts_on_a_click(driver, baseline_page):
    browser.load(driver, baseline_page)

    def column(key):
        return [float(td.get_attribute("data-value")) for td in css(driver, f'#board tbody td[data-key="{key}"]')]

    before = column("speed_factor_nfe")
    assert before != sorted(before, reverse=True)  # the report's order first (NTP first)
    header = css(driver, '#board th[data-key="speed_factor_nfe"]')[0]
    header.click()
    assert column("speed_factor_nfe") == sorted(before, reverse=True)
    assert css(driver, '#board th[data-key="speed_factor_nfe"]')[0].get_attribute("aria-sort") == "descending"
    css(driver, '#board th[data-key="speed_factor_nfe"]')[0].click()
    assert column("speed_factor_nfe") == sorted(before)
    css(driver, '#board th[data-key="config"]')[0].click()
    names = [tr.get_attribute("data-config") for tr in css(driver, "#board tbody tr")]
    assert names == sorted(names)
    aup = column("aup")
    css(driver, '#board th[data-key="aup"]')[0].click()  # the family's AUP sorts like every figure
    assert column("aup") == sorted(aup, reverse=True) != aup


def test_hovering_a_point_names_its_configuration(driver, baseline_page):
    from selenium.webdriver import ActionChains

    browser.load(driver, baseline_page)
    rows = json.loads((ROOT / "results" / "baseline" / "summary.json").read_text())["rows"]
    fronts = page.page_data("baseline", {}, [], rows, [])["fronts"]
    tooltip = css(driver, "#tooltip")[0]
    assert not tooltip.is_displayed()
    # points that no other configuration covers on arith (the tooltip of covered ones lists the others too)
    for speed, config in (("nfe", "fixed_k:k=2"), ("nfe", "confidence:tau=0.9"),
                          ("wall", "entropy_bounded:gamma=0.35,proxy=entropy")):
        css(driver, f'#plot button[data-speed="{speed}"]')[0].click()
        point = css(driver, f'#plot-area .point[data-config="{config}"]')[0]
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", point)
        ActionChains(driver).move_to_element(point).perform()
        assert tooltip.is_displayed()
        text = tooltip.text
        assert text.startswith(config) and "accuracy" in text and "speed NFE" in text
        assert ("on the Pareto front" in text) == (config in fronts[speed]["arith"]), (speed, config, text)
        ActionChains(driver).move_by_offset(0, 200).perform()
        assert not tooltip.is_displayed()
    assert "confidence:tau=0.9" in fronts["nfe"]["arith"] and "fixed_k:k=2" not in fronts["nfe"]["arith"]


def test_timeline_steps_forward(driver, traced_page):
    assert page_problems(driver, traced_page) == []
    css(driver, '.example[data-id="0"] .summary')[0].click()

    def open_timeline(config):
        css(driver, f'.example[data-id="0"] tr[data-config="{config}"] .show-timeline')[0].click()
        return css(driver, ".timeline")[0]

    def step(box):
        box.find_element("css selector", ".next").click()
        return box.find_element("css selector", ".step-label").text

    def cells(box, kind=""):
        return [c.text.split("\n")[0] for c in box.find_elements("css selector", f".tokens .tok{kind}")]

    box = open_timeline(tf.BLOCKS)
    assert box.get_attribute("data-forwards") == "6" and cells(box, ".now") == []
    assert step(box) == "forward 1 of 6"
    assert cells(box, ".now") == ["a", "d"] and cells(box, ".masked") == ["▢", "▢"]
    assert step(box) == "forward 2 of 6" and cells(box, ".now") == ["b", "c"]
    box.find_element("css selector", ".last").click()
    assert "".join(cells(box, ":not(.future):not(.void)")) == "abcdefghij." and box.get_attribute("data-step") == "6"
    assert cells(box, ".void") == ["z"]  # revealed after the stop, dropped

    box = open_timeline(tf.VERIFIED)
    step(box)
    assert cells(box, ".draft") == ["b", "c", "x"]  # drafts wait for the next forward's verdict
    step(box)  # NTP rejects x: d replaces it, the block drawn after x is void
    assert cells(box, ".rejected") == ["x"] and cells(box, ".replaced") == ["d"] and len(cells(box, ".void")) == 4
    assert "2 accepted" in box.find_element("css selector", ".step-info").text

    box = open_timeline(tf.REVOKING)
    step(box)
    step(box)
    assert cells(box, ".revoked") == ["q"]
    assert browser.console_errors(driver) == []


def test_outputs_show_their_differences_from_ntp(driver, traced_page):
    browser.load(driver, traced_page)
    css(driver, '.example[data-id="2"] .summary')[0].click()
    row = css(driver, f'.example[data-id="2"] tr[data-config="{tf.BLOCKS}"]')[0]
    assert [e.text for e in row.find_elements("css selector", "del")] == ["d"]
    assert [e.text for e in row.find_elements("css selector", "ins")] == ["x"]
    assert driver.execute_script("return window.sbdReport.diff('kitten', 'sitting')") == [
        ["-", "k"], ["+", "s"], ["=", "itt"], ["-", "e"], ["+", "i"], ["=", "n"], ["+", "g"]]


def test_broken_script_is_caught(driver, traced_page, tmp_path):
    """The checks above see a page whose script fails: one wrong line in report.js."""
    text = traced_page.read_text(encoding="utf-8")
    broken = tmp_path / "report.html"
    broken.write_text(text.replace("renderTabs();\n", "renderTabs(data.tasks.none.length);\n", 1), encoding="utf-8")
    assert broken.read_text(encoding="utf-8") != text
    problems = page_problems(driver, broken)
    assert any(p.startswith("console: ") and "TypeError" in p for p in problems), problems
    assert "the page's script did not finish drawing it" in problems
