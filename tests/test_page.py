"""report.html: built from the records alone, self-contained, and working in a real browser (headless
Chromium): no console error, no request leaving the file, the leaderboard's numbers equal
summary.json's and sort on a click or a key, the plot draws the intervals and names a point on hover,
verdicts and configurations are told apart without colour, every sample of a sampled run counts, a
traced example's decoding steps forward, a 390 px window, the summary, filters, legend, permalinks and
the compare page. One browser per module. The browser tests skip only where Chromium is missing locally; CI (.ci/run) installs it and
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
from measure_fixtures import crafted_record, crafted_run, standard_records
from sbd_bench.analysis import page
from sbd_bench.analysis.metrics import summarize
from sbd_bench.analysis.records import RunFolderError, load_run
from sbd_bench.analysis.report import main_table, markdown, ordered, write_report
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
        # the 95% intervals the plot's whiskers are drawn from
        assert shown["bounds"] == {c.key: [row[c.interval[0]], row[c.interval[1]]] for c in page.columns_of(rows)
                                   if c.interval and row.get(c.interval[0]) is not None}
    assert any(shown["bounds"] for shown in data["rows"])
    assert [c["name"] for c in data["configs"] if c["ntp"]] == ["ntp"]
    assert "Interactive: [report.html](report.html)" in (run / "report.md").read_text()


def test_summary_matrix_and_headline(tmp_path):
    records = standard_records()
    rows = ordered(summarize(records))
    data = page.page_data("x", {"provenance": {}}, records, rows, [])
    names = [c["name"] for c in data["configs"]]
    assert [[names[i], *cells] for i, *cells in data["matrix"]] == main_table(rows)[1]  # report.md's main table
    # entropy_bounded keeps NTP's 100% (mean of 8/4, 9/4, 10/5, 11/5, 12/6 = 2.09x); fixed_k, faster, loses accuracy
    assert data["headline"] == ("Fastest (NFE speed factor) at NTP's accuracy or above: arith 2.09x "
                                "entropy_bounded:gamma=0.35,proxy=entropy; copy 2.09x entropy_bounded:gamma=0.35,proxy=entropy.")
    for r in records:
        r["correct"] = r["correct"] and r["solver"] == "ntp"
    assert page.headline(ordered(summarize(records)), ["arith"]) == \
        "Fastest (NFE speed factor) at NTP's accuracy or above: arith: none keeps NTP's accuracy."
    run = crafted_run(tmp_path / "run", standard_records())
    write_report(run)  # the page links the CSV tables written beside it
    assert embedded(run / "report.html")["links"] == ["table.csv", "rows.csv"]
    assert 'href="table.csv"' not in (run / "report.html").read_text()  # drawn by the script, from "links"


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
    assert all(sample[4] is None for ex in data["examples"]["copy"][1:] for cell in ex["cells"] for sample in cell)
    assert data["examples"]["copy"][1]["cells"][0] == [[0, True, 5, 5, None, None]]  # verdicts and counts stay


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


def crafted_records() -> list[dict]:
    """standard_records with every verdict kind on arith (example 1: a configuration without verdict,
    2: one that raised, 3: one not decoded) and a sampled configuration, 3 samples per example, whose
    sample 1 of example 0 alone is wrong."""
    records = []
    for r in standard_records():
        where = (r["task"], r["id"], r["config"].split(":")[0])
        if where == ("arith", "3", "entropy_bounded"):
            continue
        if where == ("arith", "1", "entropy_bounded"):
            r["correct"] = None
        if where == ("arith", "2", "fixed_k"):
            r["correct"], r["error"] = None, "RuntimeError: boom"
        records.append(r)
    for i in range(5):
        for sample in range(3):
            r = crafted_record(SAMPLED, "arith", str(i), nfe=5, tokens=8 + i, correct=(i, sample) != (0, 1),
                               decode_time_s=0.02)
            r.update(params={"k": 2, "temperature": 0.7}, sample=sample, seed=sample,
                     output_text="y" * (8 + i) + str(sample))
            records.append(r)
    return records


SAMPLED = "fixed_k:k=2,temperature=0.7"


@pytest.fixture(scope="module")
def crafted_page(tmp_path_factory):
    run = crafted_run(tmp_path_factory.mktemp("crafted") / "run", crafted_records())
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


def choose(driver, selector, value):
    """Pick ``value`` in the <select> at ``selector``, as a person does."""
    from selenium.webdriver.support.ui import Select

    Select(css(driver, selector)[0]).select_by_value(value)


def test_every_row_shows_summary_json_figures(driver, baseline_page):
    assert page_problems(driver, baseline_page) == []
    summary = json.loads((ROOT / "results" / "baseline" / "summary.json").read_text())
    if "aup" not in summary["rows"][0]:  # a baseline summarised before AUP: the one definition adds its fields
        annotate(summary["rows"], load_run(ROOT / "results" / "baseline")[1])
    columns = [(c.key, c.value_text) for c in page.columns_of(summary["rows"])]
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
                assert written == text(row), (task, row["config"], key)
            seen += 1
    assert seen == len(summary["rows"]) >= 36  # every row of the committed baseline (56 and more)
    assert browser.console_errors(driver) == []


def test_summary_on_top_links_and_copies_markdown(driver, tmp_path):
    run = crafted_run(tmp_path / "run", standard_records())
    write_report(run)
    browser.load(driver, run / "report.html")
    order = driver.execute_script("return [...document.querySelectorAll('body section, body nav')].map((e) => e.id)")
    assert order[:2] == ["summary", "tasks"]  # before the task tabs: it is every task's
    shown = driver.execute_script("""return [...document.querySelectorAll('#matrix tbody tr')].map((tr) =>
        [tr.dataset.config, ...[...tr.querySelectorAll('td')].slice(1).map((td) => td.textContent)]);""")
    rows = ordered(summarize(standard_records()))
    assert shown == main_table(rows)[1]
    assert css(driver, "#headline")[0].text.startswith("Fastest (NFE speed factor) at NTP's accuracy or above: arith")
    assert [a.get_attribute("href").rsplit("/", 1)[-1] for a in css(driver, "#summary-links a")] == ["table.csv", "rows.csv"]
    assert all((run / name).is_file() for name in ("table.csv", "rows.csv"))
    css(driver, '#summary .to-task[data-task="copy"]')[0].click()
    assert css(driver, '#tasks button[aria-selected="true"]')[0].get_attribute("data-task") == "copy"
    css(driver, '#board th[data-key="speed_factor_nfe"]')[0].click()
    css(driver, "#summary .copy-board")[0].click()
    text = css(driver, "#copied")[0].get_attribute("value").splitlines()
    assert text[0].startswith("| config | n | errors | accuracy % |") and set(text[1]) == {"|", "-"}
    assert [line.split(" | ")[0][2:] for line in text[2:]] == \
        [tr.get_attribute("data-config") for tr in css(driver, "#board tbody tr")]  # in the order shown
    assert text[2].startswith("| fixed_k:k=4 | 5 | 0 | 60.0 [") and len(text) == 5  # the fastest first
    css(driver, "#summary .copy-summary")[0].click()
    assert css(driver, "#copied")[0].get_attribute("value") == markdown(*main_table(rows))


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


def test_keyboard_alone_sorts_switches_tasks_and_opens_examples(driver, baseline_page):
    from selenium.webdriver import ActionChains, Keys

    browser.load(driver, baseline_page)

    def press(*keys):
        ActionChains(driver).send_keys(*keys).perform()

    def focused():
        return driver.execute_script("""const e = document.activeElement;
            return [e.getAttribute('role'), (e.closest('th') || e).dataset.key || e.dataset.task || e.className];""")

    for _ in range(12):  # past the run's details and the summary's buttons
        press(Keys.TAB)
        if focused()[0] == "tab":
            break
    assert focused() == ["tab", "arith"]  # one tab in the Tab order, the selected one
    tab = css(driver, '#tasks button[data-task="arith"]')[0]
    assert css(driver, "#" + tab.get_attribute("aria-controls"))[0].get_attribute("role") == "tabpanel"
    press(Keys.ARROW_RIGHT)
    assert focused() == ["tab", "reverse"]
    assert css(driver, '#tasks button[aria-selected="true"]')[0].get_attribute("data-task") == "reverse"
    press(Keys.ARROW_LEFT, Keys.ARROW_LEFT)
    assert focused() == ["tab", "tag"]  # wraps round
    press(Keys.HOME)
    assert focused() == ["tab", "arith"]
    press(Keys.TAB, Keys.TAB)
    assert focused()[1] == "n"  # the headers are in the Tab order: config, then n
    sort = lambda: css(driver, '#board th[data-key="n"]')[0].get_attribute("aria-sort")  # noqa: E731
    press(Keys.ENTER)
    assert sort() == "descending" and focused()[1] == "n"
    press(Keys.SPACE)
    assert sort() == "ascending"
    summary = css(driver, ".example .summary")[0]
    driver.execute_script("arguments[0].focus()", summary)
    y = driver.execute_script("return scrollY")
    press(Keys.SPACE)
    assert summary.get_attribute("aria-expanded") == "true" and driver.execute_script("return scrollY") == y
    press(Keys.ENTER)
    assert summary.get_attribute("aria-expanded") == "false"


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
        assert text.startswith(config) and "accuracy %" in text and "speed factor NFE" in text
        assert ("on the Pareto front" in text) == (config in fronts[speed]["arith"]), (speed, config, text)
        ActionChains(driver).move_by_offset(0, 200).perform()
        assert not tooltip.is_displayed()
    assert "confidence:tau=0.9" in fronts["nfe"]["arith"] and "fixed_k:k=2" not in fronts["nfe"]["arith"]


def test_plot_draws_the_95_percent_intervals(driver, baseline_page):
    browser.load(driver, baseline_page)
    rows = {r["config"]: r for r in json.loads((ROOT / "results" / "baseline" / "summary.json").read_text())["rows"]
            if r["task"] == "arith"}
    for speed in ("nfe", "wall"):
        css(driver, f'#plot button[data-speed="{speed}"]')[0].click()
        whiskers = driver.execute_script("""return [...document.querySelectorAll('#plot-area .whisker')].map((w) =>
            [w.dataset.config, w.dataset.axis, ...['x1', 'x2', 'y1', 'y2'].map((a) => +w.getAttribute(a))]);""")
        marks = {c: 2 for c, r in rows.items() if r.get("accuracy_lo") is not None}
        assert sorted(w[0] for w in whiskers) == sorted(c for c, n in marks.items() for _ in range(n))
        # each whisker spans its row's interval: pixels per unit the same for every configuration (one axis)
        per_unit = {axis: [abs(w[2 + 2 * (axis == "y")] - w[3 + 2 * (axis == "y")]) /
                           (rows[w[0]][f"{key}_hi"] - rows[w[0]][f"{key}_lo"])
                           for w in whiskers if w[1] == axis and rows[w[0]][f"{key}_hi"] > rows[w[0]][f"{key}_lo"]]
                    for axis, key in (("x", f"speed_factor_{speed}"), ("y", "accuracy"))}
        for axis, scales in per_unit.items():
            assert len(scales) >= 8 and max(scales) - min(scales) < 1e-6 * max(scales), (speed, axis, scales)


def test_verdicts_told_apart_without_colour(driver, crafted_page, baseline_page):
    assert page_problems(driver, crafted_page) == []
    squares = driver.execute_script("""return [...document.querySelectorAll('.example .verdicts .v')].map((v) =>
        [v.dataset.verdict, v.textContent, getComputedStyle(v).backgroundColor, getComputedStyle(v).borderStyle]);""")
    kinds = {kind: (glyph, colour, border) for kind, glyph, colour, border in squares}
    assert set(kinds) == {"true", "false", "null", "error", "none"}
    glyphs = [glyph for glyph, _, _ in kinds.values()]
    assert len(set(glyphs)) == 5 and "" in glyphs  # a glyph each ("not decoded": an empty, dashed square)
    assert len({(colour, border) for _, colour, border in kinds.values()}) == 5  # and two distinct greys
    # configurations: one colour scheme of nine colours, then the fill; shape says NTP / verified / other
    browser.load(driver, baseline_page)
    swatches = driver.execute_script("""return [...document.querySelectorAll('#board tbody td[data-key=config]')].map((td) =>
        [td.parentNode.dataset.config, ...['color', 'fill', 'shape'].map((k) => td.querySelector('.swatch').dataset[k])]);""")
    assert len(swatches) == 16 and len({tuple(s[1:3]) for s in swatches}) == 16  # the 16 arith configurations
    assert len({s[1] for s in swatches}) == 9 and {s[2] for s in swatches} == {"solid", "hollow"}
    assert [s[0] for s in swatches if s[3] == "square"] == ["ntp"]
    assert all((s[3] == "diamond") == ("verify=on" in s[0]) for s in swatches if s[0] != "ntp")
    points = driver.execute_script("""return [...document.querySelectorAll('#plot-area .point')].map((p) =>
        [p.dataset.config, p.dataset.color, p.dataset.fill]);""")
    assert sorted(map(tuple, points)) == sorted(tuple(s[:3]) for s in swatches)  # the plot's markers = the legend's


def test_every_sample_of_a_sampled_run_is_shown(driver, crafted_page):
    browser.load(driver, crafted_page)

    def squares(eid):
        return [v.text for v in css(driver, f'.example[data-id="{eid}"] .vgroup[data-config="{SAMPLED}"] .v')]

    assert squares("0") == ["✓", "✗", "✓"] and squares("4") == ["✓", "✓", "✓"]  # sample 1 of example 0 is wrong
    choose(driver, "#example-filter", "wrong")
    assert "0" in [e.get_attribute("data-id") for e in css(driver, ".example")]
    choose(driver, "#example-filter", "all")
    css(driver, '.example[data-id="0"] .summary')[0].click()
    rows = css(driver, f'.example[data-id="0"] tr[data-config="{SAMPLED}"]')
    assert [r.get_attribute("data-sample") for r in rows] == ["0", "1", "2"]
    assert [r.find_elements("css selector", "td")[1].text for r in rows] == ["✓", "✗", "✓"]
    assert [r.find_elements("css selector", ".output")[0].text for r in rows] == [f"yyyyyyyy{s}" for s in range(3)]


def test_filter_by_configuration_and_hide_from_the_legend(driver, crafted_page):
    browser.load(driver, crafted_page)

    def ids():
        return [e.get_attribute("data-id") for e in css(driver, ".example")]

    options = {o.text: o.get_attribute("value") for o in css(driver, "#example-filter optgroup option")}
    assert list(options) == ["ntp wrong", "entropy_bounded:gamma=0.35,proxy=entropy wrong", "fixed_k:k=4 wrong",
                             f"{SAMPLED} wrong"]
    choose(driver, "#example-filter", options["fixed_k:k=4 wrong"])
    assert ids() == ["1", "2", "3"]  # wrong on the odd examples, raised on 2
    choose(driver, "#example-filter", options[f"{SAMPLED} wrong"])
    assert ids() == ["0"]
    choose(driver, "#example-filter", options["ntp wrong"])
    assert ids() == [] and "No example of arith" in css(driver, "#example-list")[0].text

    def drawn():
        return sorted({e.get_attribute("data-config") for e in css(driver, "#plot-area .point, #plot-area .whisker")})

    everyone = drawn()
    assert "fixed_k:k=4" in everyone
    css(driver, '#plot-area .legend-entry[data-config="fixed_k:k=4"]')[0].click()
    assert drawn() == [c for c in everyone if c != "fixed_k:k=4"]
    entry = css(driver, '#plot-area .legend-entry[data-config="fixed_k:k=4"]')[0]
    assert entry.get_attribute("aria-pressed") == "false"
    css(driver, '#plot-area .legend-entry[data-config="ntp"]')[0].click()
    assert drawn() == [c for c in everyone if c not in ("fixed_k:k=4", "ntp")]
    css(driver, "#plot-area .legend-all")[0].click()
    assert drawn() == everyone and css(driver, "#plot-area .legend-all") == []


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


def test_timeline_strikes_only_the_judged_drafts(driver, baseline_page):
    """tag test-0, fixed_k:k=16,verify=on: forward 1 drafts output 1-11 ("ss 489 JJJ<eos>", four <pad> after
    it); forward 2, no block of its own, accepts 7 and rejects the J at output 8: four drafts struck."""
    browser.load(driver, baseline_page)
    css(driver, '#tasks button[data-task="tag"]')[0].click()
    config = "fixed_k:k=16,verify=on"
    css(driver, '.example[data-id="test-0"] .summary')[0].click()
    css(driver, f'.example[data-id="test-0"] tr[data-config="{config}"] .show-timeline')[0].click()
    box = css(driver, ".timeline")[0]

    def cells(kind):
        return [c.text.split("\n")[0] for c in box.find_elements("css selector", f".tokens .tok{kind}")]

    box.find_element("css selector", ".next").click()
    assert len(cells(".draft")) == 11 and "<pad>" not in cells(".draft")  # none past the answer's end
    box.find_element("css selector", ".next").click()
    assert cells(".rejected") == ["J", "J", "J", "<eos>"]
    info = box.find_element("css selector", ".step-info").text
    assert "judged 11 draft(s)" in info and "7 accepted" in info and "3 later draft(s) dropped" in info
    assert "void" not in info and "no block of its own" in info
    box.find_element("css selector", ".last").click()
    assert len(cells("")) == 12 and cells(".future") == [] and cells(".draft") == []


def test_small_screens_and_edges(driver, baseline_page, crafted_page):
    from selenium.webdriver import ActionChains

    size = driver.get_window_size()
    driver.set_window_size(390, 844)
    try:
        browser.load(driver, baseline_page)
        fit = driver.execute_script("""const t = document.querySelector('#plot-area svg .axis text'), svg = t.ownerSVGElement;
            return [document.documentElement.scrollWidth, document.documentElement.clientWidth,
                parseFloat(getComputedStyle(t).fontSize) * svg.getBoundingClientRect().width / svg.viewBox.baseVal.width,
                document.querySelector('#headline').getBoundingClientRect().bottom, innerHeight,
                document.querySelector('#provenance').open];""")
        assert fit[0] == fit[1], "the page scrolls sideways at 390 px"
        assert fit[2] >= 10, f"tick labels drawn at {fit[2]:.1f} px"
        assert fit[3] < fit[4] / 2 and fit[5] is False  # the summary's headline on the first screen, provenance folded
    finally:
        driver.set_window_size(size["width"], size["height"])
    browser.load(driver, baseline_page)
    # the sticky tab bar leaves a control scrolled to the top of the window (a link, a search) visible
    switch = css(driver, '#plot button[data-speed="wall"]')[0]
    driver.execute_script("arguments[0].scrollIntoView()", switch)
    assert driver.execute_script("""const r = arguments[0].getBoundingClientRect();
        return document.elementFromPoint(r.left + r.width / 2, r.top + r.height / 2) === arguments[0]""", switch)
    # a tooltip at the window's bottom edge opens above the pointer, inside the window
    point = css(driver, '#plot-area .point[data-config="fixed_k:k=2"]')[0]
    driver.execute_script("arguments[0].scrollIntoView({block: 'end'}); window.scrollBy(0, 8)", point)
    ActionChains(driver).move_to_element(point).perform()
    tip = driver.execute_script("const r = document.getElementById('tooltip').getBoundingClientRect(); return [r.top, r.bottom, innerHeight]")
    assert 0 <= tip[0] and tip[1] <= tip[2], tip
    # a filter that no example passes says so
    browser.load(driver, crafted_page)
    css(driver, '#tasks button[data-task="copy"]')[0].click()
    choose(driver, "#example-filter", "traced")
    assert css(driver, ".example") == [] and "choose \"all examples\"" in css(driver, "#example-list")[0].text


def test_permalink_opens_the_same_view(driver, baseline_page):
    from selenium.webdriver.support.ui import WebDriverWait

    browser.load(driver, baseline_page)
    config = "fixed_k:k=16,verify=on"
    css(driver, '#tasks button[data-task="tag"]')[0].click()
    css(driver, '#board th[data-key="speed_factor_nfe"]')[0].click()
    css(driver, '#plot button[data-speed="wall"]')[0].click()
    css(driver, '#plot-area .legend-entry[data-config="fixed_k:k=2"]')[0].click()
    css(driver, '.example[data-id="test-0"] .summary')[0].click()
    css(driver, f'.example[data-id="test-0"] tr[data-config="{config}"] .show-timeline')[0].click()
    css(driver, ".timeline .next")[0].click()
    css(driver, ".timeline .next")[0].click()
    link = driver.current_url
    assert "#" in link and "task=tag" in link and "step=2" in link

    def view():
        return driver.execute_script("""return {
            task: document.querySelector('#tasks [aria-selected=true]').dataset.task,
            sort: [...document.querySelectorAll('#board th')].filter((th) => th.getAttribute('aria-sort') !== 'none')
                .map((th) => th.dataset.key + ' ' + th.getAttribute('aria-sort')),
            speed: document.querySelector('#plot button[aria-pressed=true]').dataset.speed,
            hidden: [...document.querySelectorAll('#plot-area .legend-entry[aria-pressed=false]')].map((b) => b.dataset.config),
            open: [...document.querySelectorAll('.example .summary[aria-expanded=true]')].map((s) => s.parentNode.dataset.id),
            timeline: [...document.querySelectorAll('.timeline')].map((t) => [t.dataset.config, t.dataset.step])};""")

    before = view()
    assert before == {"task": "tag", "sort": ["speed_factor_nfe descending"], "speed": "wall", "hidden": ["fixed_k:k=2"],
                      "open": ["test-0"], "timeline": [[config, "2"]]}
    for _ in range(2):  # followed from elsewhere, and reloaded
        driver.get("about:blank")
        driver.get(link)
        WebDriverWait(driver, 30).until(lambda d: d.execute_script("return !!(window.sbdReport && window.sbdReport.ready)"))
        assert view() == before
        assert driver.current_url == link
    # a fragment naming what the page lacks opens the page as it is
    driver.get("about:blank")
    driver.get(link.split("#")[0] + "#task=nope&sort=zzz:up&example=none&hide=x")
    WebDriverWait(driver, 30).until(lambda d: d.execute_script("return !!(window.sbdReport && window.sbdReport.ready)"))
    assert view() == {"task": "arith", "sort": [], "speed": "nfe", "hidden": [], "open": [], "timeline": []}
    assert browser.console_errors(driver) == []


def test_outputs_show_their_differences_from_ntp(driver, traced_page):
    browser.load(driver, traced_page)
    css(driver, '.example[data-id="2"] .summary')[0].click()
    row = css(driver, f'.example[data-id="2"] tr[data-config="{tf.BLOCKS}"]')[0]
    assert [e.text for e in row.find_elements("css selector", "del")] == ["d"]
    assert [e.text for e in row.find_elements("css selector", "ins")] == ["x"]
    assert driver.execute_script("return window.sbdReport.diff('kitten', 'sitting')") == [
        ["-", "k"], ["+", "s"], ["=", "itt"], ["-", "e"], ["+", "i"], ["=", "n"], ["+", "g"]]


def test_compare_writes_both_runs_on_one_page(driver, tmp_path, capsys):
    base = crafted_run(tmp_path / "a", standard_records())
    changed = standard_records()
    for r in changed:
        r["correct"] = True if r["config"] == "fixed_k:k=4" and r["task"] == "arith" else r["correct"]
    run = crafted_run(tmp_path / "b", changed)
    out = tmp_path / "cmp" / "compare.html"
    assert main(["compare", str(base), str(run), "--html", str(out)]) == 1  # accuracy moved: a regression, still drawn
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["page"] == str(out)
    data = embedded(out)
    names = [c["name"] for c in data["configs"]]
    assert names == [f"{c} [{run}]" for c in ("ntp", "entropy_bounded:gamma=0.35,proxy=entropy", "fixed_k:k=4")
                     for run in ("a", "b")]
    assert [names[c["base"]] for c in data["configs"]] == ["ntp [a]", "ntp [b]"] * 3  # each against its own NTP
    acc = {(data["tasks"][r["task"]], names[r["config"]]): r["values"]["accuracy"] for r in data["rows"]}
    assert acc["arith", "fixed_k:k=4 [a]"] == 0.6 and acc["arith", "fixed_k:k=4 [b]"] == 1.0
    assert page_problems(driver, out) == []
    assert driver.title == "sbd_bench compare: b against a" and "Two runs side by side" in css(driver, "#banner")[0].text
    css(driver, '.example[data-id="1"] .summary')[0].click()
    verdicts = {tr.get_attribute("data-config"): tr.find_elements("css selector", "td")[1].text
                for tr in css(driver, '.example[data-id="1"] tr[data-config]')}
    assert verdicts["fixed_k:k=4 [a]"] == "✗" and verdicts["fixed_k:k=4 [b]"] == "✓"
    # written again over itself; never over a file compare did not write (a run's own page here)
    assert main(["compare", str(base), str(run), "--html", str(out)]) == 1
    capsys.readouterr()
    write_run_page(base, base)
    before = (base / "report.html").read_text()
    assert main(["compare", str(base), str(run), "--html", str(base / "report.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--html" in err and "did not write" in err, err
    assert (base / "report.html").read_text() == before


def test_broken_script_is_caught(driver, traced_page, tmp_path):
    """The checks above see a page whose script fails: one wrong line in report.js."""
    text = traced_page.read_text(encoding="utf-8")
    broken = tmp_path / "report.html"
    broken.write_text(text.replace("renderTabs();\n", "renderTabs(data.tasks.none.length);\n", 1), encoding="utf-8")
    assert broken.read_text(encoding="utf-8") != text
    problems = page_problems(driver, broken)
    assert any(p.startswith("console: ") and "TypeError" in p for p in problems), problems
    assert "the page's script did not finish drawing it" in problems
