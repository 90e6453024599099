"""Issue 42: gatelab.app takes everything past a function's first argument by keyword. The runs folder, the MLflow
store and the ledger crossed dozens of signatures by position, and their order had drifted between callers; a value
passed by name cannot land in the wrong slot."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import types

import pytest

import gatelab.app

POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
MODULES = ["gatelab.app"] + [f"gatelab.app.{info.name}" for info in pkgutil.iter_modules(gatelab.app.__path__)]


def positional_beyond_the_first(module: types.ModuleType) -> list[str]:
    """'function(name, ...)' for every public function defined in `module` that takes more than one positional
    parameter, naming the positional ones past the first."""
    found = []
    for name, function in sorted(vars(module).items()):
        if name.startswith("_") or not inspect.isfunction(function) or function.__module__ != module.__name__:
            continue
        positional = [p.name for p in inspect.signature(function).parameters.values() if p.kind in POSITIONAL]
        if len(positional) > 1:
            found.append(f"{name}({', '.join(positional[1:])})")
    return found


@pytest.mark.parametrize("module_name", MODULES)
def test_every_public_function_takes_one_positional_parameter_at_most(module_name):
    assert positional_beyond_the_first(importlib.import_module(module_name)) == []


def test_the_check_sees_a_second_positional_parameter_and_skips_what_is_not_the_modules():
    module = types.ModuleType("fake_app")
    exec("from os.path import join\n"  # imported: not this module's
         "def ok(sweep, *, workspace): pass\n"
         "def drifted(sweep, storage, experiment=None, *, verbose=False): pass\n"
         "def _private(a, b): pass\n", module.__dict__)
    assert positional_beyond_the_first(module) == ["drifted(storage, experiment)"]


def test_every_module_of_gatelab_app_is_checked():
    assert {"gatelab.app.sweep", "gatelab.app.sweep_run", "gatelab.app.score", "gatelab.app.options"} <= set(MODULES)
