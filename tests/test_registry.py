"""Solver discovery (built-in folder, --plugins folders, entry points) and --solver spec parsing."""
import sys
import textwrap

import pytest

from sbd_bench.registry import RegistryError, parse_solver_spec, solver_registry
from sbd_bench.types import GenerateBaseline, SolverError

SOLVER_SOURCE = textwrap.dedent('''
    from dataclasses import dataclass
    from typing import ClassVar
    from sbd_bench.types import Solver, reveal_top

    @dataclass(frozen=True)
    class {cls}(Solver):
        name: ClassVar[str] = "{name}"
        def select(self, view):
            return reveal_top(view.confidence, view.masked, 1)
''')


def test_spec_parsing():
    reg = solver_registry()
    labels = [s.label for s in parse_solver_spec("entropy_bounded:gamma=0.1,0.35;proxy=entropy,margin", reg)]
    assert labels == ["ntp", "entropy_bounded:gamma=0.1,proxy=entropy", "entropy_bounded:gamma=0.1,proxy=margin",
                      "entropy_bounded:gamma=0.35,proxy=entropy", "entropy_bounded:gamma=0.35,proxy=margin"]
    assert [s.label for s in parse_solver_spec("fixed_k,confidence:tau=0.5+factor", reg)] == [
        "ntp", "fixed_k:k=2", "confidence:tau=0.5", "factor:f=1.0"]
    everything = parse_solver_spec("all", reg)
    generate = {name for name, cls in reg.items() if issubclass(cls, GenerateBaseline)}  # named, never in all
    assert everything[0].name == "ntp" and {s.name for s in everything} == set(reg) - generate and generate
    assert parse_solver_spec("entropy_bounded:gamma=inf", reg)[1].gamma == float("inf")
    assert [s.label for s in parse_solver_spec("ntp,ntp", reg)] == ["ntp"]  # duplicates run once


@pytest.mark.parametrize("spec, message", [
    ("entropy_bonded", "did you mean 'entropy_bounded'"),
    ("", "empty --solver"),
    ("fixed_k:k", "write key=value"),
    ("fixed_k:k=", "write key=value"),
])
def test_bad_specs(spec, message):
    with pytest.raises((RegistryError, SolverError), match=message):
        parse_solver_spec(spec, solver_registry())


def test_plugin_folder_errors(tmp_path):
    with pytest.raises(RegistryError, match="does not exist"):
        solver_registry([tmp_path / "nope"])
    (tmp_path / "broken.py").write_text("import no_such_module_anywhere\n")
    with pytest.raises(RegistryError, match="cannot import solver plugin .*broken.py"):
        solver_registry([tmp_path])


def test_plugin_name_clash_is_refused(tmp_path):
    (tmp_path / "clash.py").write_text(SOLVER_SOURCE.format(cls="Clash", name="fixed_k"))
    with pytest.raises(RegistryError, match="'fixed_k' .* already taken"):
        solver_registry([tmp_path])


def test_entry_point_solvers_are_discovered(tmp_path, monkeypatch):
    pkg = tmp_path / "ep_solver_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(SOLVER_SOURCE.format(cls="FromEntryPoint", name="from_entry_point"))
    dist = tmp_path / "ep_solver_pkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: ep-solver-pkg\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[sbd_bench.solvers]\nfrom_entry_point = ep_solver_pkg:FromEntryPoint\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    reg = solver_registry()
    assert reg["from_entry_point"].__module__ == "ep_solver_pkg"
    sys.modules.pop("ep_solver_pkg", None)
