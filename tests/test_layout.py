"""The package's layering (pyproject.toml, [tool.importlinter]) holds, and breaking it is caught:
an upward import, an import circle and a solver reaching into the core each fail `lint-imports`."""
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def lint_imports(tree: Path) -> subprocess.CompletedProcess:
    exe = shutil.which("lint-imports")
    assert exe, "lint-imports is missing: pip install -e '.[test]' installs import-linter"
    return subprocess.run([exe, "--no-cache"], cwd=tree, capture_output=True, text=True, timeout=120)


def copy_tree(tmp_path: Path) -> Path:
    for name in ("sbd_bench", "solvers"):
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def add_import(path: Path, after: str, line: str) -> None:
    text = path.read_text()
    assert after in text, f"{path} no longer has {after!r}: pick another anchor for this test"
    path.write_text(text.replace(after, after + line, 1))


def test_the_layering_holds():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("where, after, line, broken", [
    # the core learns of runs: an upward import
    ("sbd_bench/core/decoding.py", "from .masks import attention_mask\n", "from ..runner import harness  # noqa\n",
     "Layers: the CLI on top"),
    # reporting pulls in torch
    ("sbd_bench/analysis/report.py", "from .roofline import prediction_columns\n", "import torch  # noqa\n",
     "Reporting reads records only"),
    # a circle between two siblings of the reporting side
    ("sbd_bench/analysis/metrics.py", "from typing import Iterable\n", "from . import compare  # noqa\n",
     "No import circles"),
    # a solver reaching past the contract
    ("solvers/fixed_k.py", "from typing import ClassVar\n", "from sbd_bench.core import decoding  # noqa\n",
     "Solvers see the contract"),
])
def test_breaking_the_layering_fails(tmp_path, where, after, line, broken):
    tree = copy_tree(tmp_path)
    add_import(tree / where, after, line)
    result = lint_imports(tree)
    assert result.returncode != 0
    _, _, broken_section = result.stdout.partition("Broken contracts")
    assert broken in broken_section, result.stdout
