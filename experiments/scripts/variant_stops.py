"""The stops a variant id makes on its way from `gatelab train` to the gate modules (issue 42's figure).

Wraps the functions that handle a variant (the id split, the registry applied, the model resolved, a gate built),
runs `gatelab train ARGS...` until Lightning's `fit` would start, and prints each distinct call stack of gatelab frames
that reached one of them, then: the stops (distinct frames on those stacks), the modules they are in, and the climbs
(how often the next stack does not continue the last one, so the flow went back up before coming down again).

    python experiments/scripts/variant_stops.py train experiments/tiny.yaml --variant g1_elem_sig --runs-dir /tmp/stops

Run it with PYTHONPATH pointing at another checkout to count an older gatelab the same way.
"""

from __future__ import annotations

import functools
import importlib
import sys
import traceback

WRAPPED = {"gatelab.variants": ("variant_ids", "apply_variant"), "gatelab.model.params": ("resolve_model",),
           "gatelab.model": ("resolve_model",)}  # the package binds its own name of it
stacks: list[tuple[str, ...]] = []


def _frame_name(filename: str, name: str) -> str:
    return f"{filename.split('/gatelab/', 1)[1]}:{name}"


def recorded(function):
    leaf = f"{function.__module__.removeprefix('gatelab.').replace('.', '/')}.py:{function.__qualname__}"

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        frames = tuple(_frame_name(f.filename, f.name) for f in traceback.extract_stack()[:-1]
                       if "/gatelab/" in f.filename and "site-packages" not in f.filename)
        if frames + (leaf,) not in stacks:
            stacks.append(frames + (leaf,))
        return function(*args, **kwargs)
    return wrapper


class FitWouldStart(Exception):
    pass


def _instrument() -> None:
    for module_name, names in WRAPPED.items():
        module = importlib.import_module(module_name)
        for name in names:
            function = getattr(module, name)
            setattr(module, name, function if hasattr(function, "__wrapped__") else recorded(function))
    gates = importlib.import_module("gatelab.model.gates")
    for cls in [c for c in vars(gates).values() if isinstance(c, type) and c.__module__ == gates.__name__]:
        if "__init__" in vars(cls):
            cls.__init__ = recorded(cls.__init__)
    import lightning

    def stop(*_args, **_kwargs):
        raise FitWouldStart
    lightning.Trainer.fit = stop


def main(argv: list[str]) -> None:
    _instrument()
    from gatelab.cli import app

    try:
        app(argv, standalone_mode=False)
    except FitWouldStart:
        pass
    stops, climbs, last = [], 0, ()
    for stack in stacks:
        shared = 0
        while shared < min(len(stack), len(last)) and stack[shared] == last[shared]:
            shared += 1
        climbs += bool(last) and shared < len(last)
        stops += [frame for frame in stack if frame not in stops]
        last = stack
        print(" > ".join(stack))
    modules = {frame.split(":")[0] for frame in stops}
    splits = sum(stack[-1].endswith(":variant_ids") for stack in stacks)
    resolved = sum(stack[-1].endswith(":resolve_model") for stack in stacks)
    built = sum(stack[-1].endswith("Gate.__init__") for stack in stacks)
    print(f"{len(stops)} stops in {len(modules)} modules, {climbs} climbs back up; the id split {splits} times, the "
          f"model resolved {resolved} times, built {built} times")


if __name__ == "__main__":
    main(sys.argv[1:])
