"""report.html at scale: its size, the time `report` takes to write it, and its load time in headless
Chromium, for a run grown to N samples from a real one (each example copied under new ids).

    python benchmarks/report_page.py results/baseline --samples 10000
    python benchmarks/report_page.py results/baseline --samples 10000 --output-chars 2000   # code-length outputs

Each output can be lengthened to ``--output-chars`` characters (a HumanEval-like answer) to see the
output budget act: past ``page.OUTPUT_BUDGET`` characters the page holds verdicts only, except for
traced examples. Prints one JSON line per run.
"""
from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sbd_bench.analysis import page  # noqa: E402
from sbd_bench.analysis.metrics import summarize  # noqa: E402
from sbd_bench.analysis.records import load_run  # noqa: E402
from sbd_bench.analysis.report import ordered  # noqa: E402


def grown(records: list[dict], samples: int, output_chars: int) -> list[dict]:
    """Repeat 0 of every sample, its examples copied under new ids until ``samples`` records."""
    first = [r for r in records if r.get("repeat", 0) == 0]
    out = []
    for copy_number in range(-(-samples // len(first))):
        for r in first:
            r = copy.deepcopy(r)
            r["id"] = f"{r['id']}-{copy_number}" if copy_number else r["id"]
            if output_chars:
                r["output_text"] = (r["output_text"] * (output_chars // max(1, len(r["output_text"])) + 1))[:output_chars]
            out.append(r)
    return out[:samples]


def measure(run_dir: Path, samples: int, output_chars: int, folder: Path) -> dict:
    spec = importlib.util.spec_from_file_location("report_browser", ROOT / "scripts" / "report_browser.py")
    browser = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(browser)
    summary, records = load_run(run_dir)
    records = grown(records, samples, output_chars)
    started = time.perf_counter()
    rows = ordered(summarize(records))
    summarized = time.perf_counter()
    path = page.write_page(folder, run_dir.name, summary, records, rows, [])
    written = time.perf_counter()
    result = {"samples": len(records), "output_chars": output_chars, "bytes": path.stat().st_size,
              "summarize_s": round(summarized - started, 2), "write_s": round(written - summarized, 2)}
    why = browser.missing()
    if why:
        return {**result, "load_ms": None, "why": why}
    driver = browser.open_browser()
    try:
        loads = sorted(browser.load(driver, path) for _ in range(3))
        errors = browser.console_errors(driver)
        data = driver.execute_script("return document.querySelectorAll('.example').length")
    finally:
        browser.close_browser(driver)
    omitted = json.loads(path.read_text().split('id="report-data">', 1)[1].split("</script>", 1)[0])["omitted"]
    return {**result, "load_ms": round(loads[1]), "console_errors": errors, "examples_drawn": data,
            "examples_verdicts_only": omitted}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="a run folder to grow (e.g. results/baseline)")
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--output-chars", type=int, default=0, help="lengthen every output to this many characters")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        print(json.dumps(measure(Path(args.run_dir), args.samples, args.output_chars, Path(folder))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
