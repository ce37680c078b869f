"""A new user's first guesses at naming their own pipeline on the command line, each answered
with one line showing the `loader=custom` form that does it (docs/own-pipeline.md)."""

from __future__ import annotations

import os

FORM = "loader=custom loader.dataset._target_={target}"
_GROUPS = ("loader", "data")


def own_pipeline_guess(args: list[str], loader_names: list[str]) -> str | None:
    """The line for an argument that names a user's code where facebench takes a loader's name
    (`loader=mydata`, `loader=mydata.build_loader`, `+loader._target_=mydata.build_loader`,
    `data._target_=...`); None when no argument does."""
    for arg in args:
        key, sep, value = arg.lstrip("+~").partition("=")
        if not sep:
            continue
        group, _, rest = key.partition(".")
        if group in _GROUPS and rest == "_target_":
            return (
                f"{arg}: facebench's {group} is chosen by name ({group}=<name>), not built from "
                f"a _target_; to measure your own pipeline: {FORM.format(target=value)}"
            )
        if key != "loader" or "," in value or value in loader_names:
            continue
        if "." in value and all(part.isidentifier() for part in value.split(".")):
            return (
                f"loader={value}: loader= takes a loader's name; to measure your class or "
                f"function {value}: {FORM.format(target=value)}"
            )
        if value.isidentifier() and _importable(value):
            return (
                f"loader={value}: {value} is a Python module here, not one of facebench's loaders "
                f"({', '.join(loader_names)}); to measure a Dataset (or a function returning a "
                f"DataLoader) from it: {FORM.format(target=f'{value}.<ClassOrFunction>')}"
            )
    return None


def _importable(name: str) -> bool:
    """Whether a module of that name is the user's: in the launch directory or on PYTHONPATH (its
    file looked for, not run). An installed package (`datasets`, `ray`) is no guess at one."""
    folders = [os.getcwd(), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return any(
        os.path.isfile(os.path.join(folder, f"{name}.py"))
        or os.path.isfile(os.path.join(folder, name, "__init__.py"))
        for folder in folders
    )
