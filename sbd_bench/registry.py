"""Solver discovery and parsing of ``--solver`` specs (tasks register in ``sbd_bench.tasks``).

Solvers come from three places, in this order (a later one may not reuse an earlier name):
  1. the built-in ``solvers/`` folder beside this package,
  2. every ``--plugins DIR`` folder: each ``*.py`` file in it is imported,
  3. the entry-point group ``sbd_bench.solvers`` (``name = "pkg.module:SolverClass"``).
A module contributes every ``Solver`` subclass it defines with a non-empty ``name``.

    >>> from sbd_bench.registry import solver_registry, parse_solver_spec
    >>> [s.label for s in parse_solver_spec("entropy_bounded:gamma=0.1,0.35", solver_registry())]
    ['entropy_bounded:gamma=0.1,proxy=entropy', 'entropy_bounded:gamma=0.35,proxy=entropy']
"""
from __future__ import annotations

import dataclasses
import importlib.metadata
import importlib.util
import itertools
import sys
import typing
from pathlib import Path

from .types import (GREEDY, SAMPLING_KEYS, GenerateBaseline, Sampling, SamplingError, Solver, SolverError, UsageError,
                    Verified, did_you_mean, generate_baseline, sampled, schedule_baseline)

BUILTIN_SOLVERS = Path(__file__).resolve().parent.parent / "solvers"
ENTRY_POINT_GROUP = "sbd_bench.solvers"
INT64 = 2 ** 63  # integer parameters reach tensors as int64
VERIFY_KEY = "verify"  # a core option in every block solver's spec, not a solver parameter
# what `all` adds to every solver at its defaults, verified: the paper's solver, and the whole block in one
# forward (one forward per block at the default k=16: never more forwards than NTP; docs/decoding.md)
VERIFIED_IN_ALL = (("entropy_bounded", {}), ("fixed_k", {"k": "16"}))


class RegistryError(UsageError):
    """An unknown name or an unreadable plugin; the message says what to do."""


def _solvers_in_module(module) -> list[type[Solver]]:
    found = []
    for obj in vars(module).values():
        if isinstance(obj, type) and issubclass(obj, Solver) and obj.name and obj.__module__ == module.__name__:
            found.append(obj)
    return found


def _import_file(path: Path, namespace: str):
    mod_name = f"{namespace}.{path.stem}"
    if mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # a broken plugin must name itself, not crash with a traceback
        del sys.modules[mod_name]
        raise RegistryError(f"cannot import solver plugin {path}: {type(exc).__name__}: {exc}") from exc
    return module


def _folder_modules(folder: Path, namespace: str):
    if folder.exists() and not folder.is_dir():
        raise RegistryError(f"--plugins {folder} is a file, not a folder: give the folder that holds solver .py files"
                            + (f" (every one in it is loaded), e.g. --plugins {folder.parent}"
                               if folder.suffix == ".py" else ""))
    if not folder.is_dir():
        raise RegistryError(f"plugin folder {folder} does not exist: pass a folder holding solver .py files")
    for path in sorted(folder.glob("*.py")):
        if not path.name.startswith("_"):
            yield path, _import_file(path, namespace)


def solver_registry(plugin_dirs: typing.Sequence[str | Path] = ()) -> dict[str, type[Solver]]:
    registry: dict[str, type[Solver]] = {}
    origin: dict[str, str] = {}

    def add(cls: type[Solver], where: str) -> None:
        if cls.name in registry and registry[cls.name] is not cls:
            raise RegistryError(f"solver name '{cls.name}' from {where} is already taken by {origin[cls.name]}: rename one")
        for f in dataclasses.fields(cls):
            if f.name == VERIFY_KEY or f.name in SAMPLING_KEYS:
                use = f"{cls.name}:{VERIFY_KEY}=on" if f.name == VERIFY_KEY else f"{cls.name}:{f.name}=..."
                raise RegistryError(f"solver '{cls.name}' from {where} has a parameter named '{f.name}', which the core "
                                    f"reserves for {'verified decoding' if f.name == VERIFY_KEY else 'sampling'} "
                                    f"('{use}'): rename it")
        registry[cls.name], origin[cls.name] = cls, where

    sources = [(BUILTIN_SOLVERS, "sbd_bench_solvers")]
    sources += [(Path(d), f"sbd_bench_plugins_{i}") for i, d in enumerate(plugin_dirs)]
    for folder, namespace in sources:
        for path, module in _folder_modules(folder, namespace):
            for cls in _solvers_in_module(module):
                add(cls, str(path))
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            cls = ep.load()
        except Exception as exc:
            raise RegistryError(f"cannot load solver entry point '{ep.name}' ({ep.value}): {exc}") from exc
        if not (isinstance(cls, type) and issubclass(cls, Solver) and cls.name):
            raise RegistryError(f"entry point '{ep.name}' ({ep.value}) is not a named sbd_bench Solver subclass")
        add(cls, f"entry point {ep.value}")
    return registry


# ------------------------------------------------------------------------------------- solver specs
def _coerce(value: str, annotation, solver: str, key: str):
    """Turn a command-line string into the type the dataclass field declares."""
    if isinstance(annotation, str):  # postponed annotations: 'float', 'int', 'str', 'bool', 'float | None'
        annotation = annotation.split("|")[0].strip()
        annotation = {"float": float, "int": int, "str": str, "bool": bool}.get(annotation, str)
    try:
        if annotation is bool:
            if value.lower() in ("1", "true", "yes"):
                return True
            if value.lower() in ("0", "false", "no"):
                return False
            raise ValueError(value)
        if annotation is float and value.lower() in ("inf", "infinity"):
            return float("inf")
        result = annotation(value)
    except ValueError:
        raise SolverError(f"{solver}: {key}={value!r} is not a valid {annotation.__name__}") from None
    if annotation is int and not -INT64 <= result < INT64:  # tensors hold it as int64: it would overflow there
        raise SolverError(f"{solver}: {key}={value} is out of range: an integer parameter must lie within "
                          f"+-{INT64 - 1} (a 64-bit integer)")
    return result


def build_solver(cls: type[Solver], overrides: dict[str, str | object]) -> Solver:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in overrides.items():
        if key not in fields:
            known = ", ".join(fields) or "none"
            raise SolverError(f"{cls.name} has no parameter '{key}' (parameters: {known})")
        kwargs[key] = _coerce(value, fields[key].type, cls.name, key) if isinstance(value, str) else value
    return cls(**kwargs)


def verified(solver: Solver) -> Solver:
    """``solver`` in the core's verify mode (``types.Verified``)."""
    if generate_baseline(solver) is not None:
        raise SolverError(f"{solver.name}: {VERIFY_KEY}=on applies to block solvers; {solver.name} decodes with "
                          f"{solver.decoded_by}, outside the core's block loop")
    if not solver.decodes_blocks:
        raise SolverError(f"{solver.name}: {VERIFY_KEY}=on applies to block solvers; {solver.name} decodes token by "
                          f"token through the causal stream already")
    return Verified(solver)


def _sampling(name: str, values: dict[str, str], default: Sampling) -> Sampling:
    """A configuration's sampling: the run-wide ``default`` with the spec's own temperature/top_p/top_k."""
    settings = {"temperature": default.temperature, "top_p": default.top_p, "top_k": default.top_k}
    for key, value in values.items():
        try:
            settings[key] = int(value) if key == "top_k" else float(value)
        except ValueError:
            kind = "an integer" if key == "top_k" else "a number"
            raise SamplingError(f"{name}: {key}={value!r} is not {kind}") from None
    try:
        return Sampling(**settings)
    except SamplingError as exc:
        raise SamplingError(f"{name}: {exc}") from None


def parse_solver_spec(spec: str, registry: dict[str, type[Solver]], sampling: Sampling = GREEDY) -> list[Solver]:
    """``all`` | ``name`` | ``name:key=v1,v2;key2=v`` | several joined by ``+``.

    A comma inside a parameter spec lists sweep values; ``;`` separates parameters; ``+`` (or a
    comma between plain names) separates solvers. The cross product of swept values is returned.
    ``verify=on`` (or ``verify=on,off``) is the core's verify mode, open to every block solver;
    ``temperature``, ``top_p`` and ``top_k`` (sweepable too) set how the core picks tokens, over the
    run-wide ``sampling``. ``all`` gives every registered solver at its defaults (but the baselines decoded
    by transformers' generate, which are named), then the verified ``VERIFIED_IN_ALL``. ``ntp`` comes first, at the sampling of every configuration that needs it as
    the baseline its speed factors are paired with (added where the spec has no such ``ntp``), then the
    block solvers, then the baselines decoded by transformers' generate (``types.GenerateBaseline``).
    """
    configs: list[Solver] = []
    for part in _split_solvers(spec):
        if part == "all":  # not the generate baselines: a draft model fits one tokenizer, and they run greedily only
            configs += [sampled(build_solver(cls, {}), sampling) for cls in registry.values()
                        if not issubclass(cls, GenerateBaseline)]
            configs += [sampled(verified(build_solver(registry[name], params)), sampling)
                        for name, params in VERIFIED_IN_ALL if name in registry]
            continue
        name, _, param_text = part.partition(":")
        name = name.strip()
        if name not in registry:
            raise RegistryError(did_you_mean(name, registry, "solver"))
        grid: dict[str, list[str]] = {}
        for item in filter(None, (p.strip() for p in param_text.split(";"))):
            key, eq, values = item.partition("=")
            if not eq or not values:
                raise SolverError(f"bad parameter '{item}' for {name}: write key=value or key=v1,v2")
            key = key.strip()
            if key in grid:  # the last one would win without a word
                raise SolverError(f"{name}: parameter '{key}' is given twice in '{part}': give it once, sweeping "
                                  f"values as one list ({key}=v1,v2)")
            grid[key] = [v.strip() for v in values.split(",")]
        modes = grid.pop(VERIFY_KEY, ["off"])
        for mode in modes:
            if mode not in ("on", "off"):
                raise SolverError(f"{name}: {VERIFY_KEY}={mode!r} must be 'on' or 'off' ({VERIFY_KEY}=on commits only "
                                  f"the drafted tokens that NTP's argmax confirms)")
        drawn = {key: grid.pop(key) for key in SAMPLING_KEYS if key in grid}
        samplings = [_sampling(name, dict(zip(drawn, combo)), sampling) for combo in itertools.product(*drawn.values())]
        for combo in itertools.product(*grid.values()):
            solver = build_solver(registry[name], dict(zip(grid, combo)))
            configs += [sampled(verified(solver) if mode == "on" else solver, how)
                        for how in samplings for mode in modes]
    unique = list({c.label: c for c in configs}.values())
    generate = [c for c in unique if generate_baseline(c) is not None]  # transformers' generate: paired with ntp too
    for c in generate:
        if not c.sampling.greedy:
            why = ("sampled assisted decoding has not passed this project's check against NTP's distribution "
                   "(docs/baselines.md#sampling)") if schedule_baseline(c) is None else \
                "its vendor's sampling (Gumbel noise in float64) is not reproduced here (docs/models.md)"
            raise SamplingError(f"{c.label}: the baselines decoded by {generate_baseline(c).decoded_by} run greedily "
                                f"only: {why}; give them temperature=0 or run them without --temperature")
    ntp = [c for c in unique if not c.decodes_blocks and c not in generate]
    if "ntp" in registry:  # the baseline every speed factor is paired with, at each configuration's sampling
        have = {c.sampling for c in ntp if c.name == "ntp"}
        needed = [c.sampling for c in unique if c.decodes_blocks or c in generate] or ([] if ntp else [sampling])
        ntp += [sampled(build_solver(registry["ntp"], {}), how) for how in dict.fromkeys(needed) if how not in have]
    return ntp + [c for c in unique if c.decodes_blocks] + generate


def _split_solvers(spec: str) -> list[str]:
    """Split 'a,b:x=1,2;y=3+c' into ['a', 'b:x=1,2;y=3', 'c']. A comma separates solvers only
    before any ':' parameter part has started."""
    parts: list[str] = []
    for chunk in spec.split("+"):
        chunk = chunk.strip()
        if not chunk:
            continue
        if ":" in chunk:
            head, _, tail = chunk.partition(":")
            names = [n.strip() for n in head.split(",")]
            parts += [n for n in names[:-1] if n]
            parts.append(f"{names[-1]}:{tail}")
        else:
            parts += [n.strip() for n in chunk.split(",") if n.strip()]
    if not parts:
        raise RegistryError("empty --solver: give 'all', a solver name, or name:param=v1,v2")
    return parts
