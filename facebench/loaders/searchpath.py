"""Loaders in a user's own config folders: the `loader/*.yaml` files of the command line's
`hydra.searchpath=[file:///path/myconf]`, each a choice of `loader=` beside facebench's own.

A user's file starts from a loader of facebench's (`defaults: [custom]` and a `dataset:`
block, or `defaults: [dataset]` with other options): that loader is what it runs."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from facebench.errors import ConfigError

SEARCHPATH = "hydra.searchpath"


def folders(args: list[str]) -> list[Path]:
    """The `file://` folders a command's hydra.searchpath names (relative ones from the launch
    directory, as Hydra reads them); `pkg://` entries hold no files to list."""
    found: list[Path] = []
    for arg in args:
        key, sep, value = arg.lstrip("+").partition("=")
        if key != SEARCHPATH or not sep:
            continue
        for entry in value.strip().strip("[]").split(","):
            entry = entry.strip().strip("'\"")
            if entry.startswith("file://"):
                found.append(Path(entry.removeprefix("file://")).expanduser().absolute())
    return found


def user_loaders(search: list[Path]) -> dict[str, Path]:
    """Each loader/<name>.yaml in the folders, by name (the first folder's where two hold it)."""
    found: dict[str, Path] = {}
    for folder in search:
        for path in sorted((folder / "loader").glob("*.yaml")):
            found.setdefault(path.stem, path)
    return found


def base_of(path: Path, known: list[str]) -> str:
    """The facebench loader a user's loader file starts from: the first of its defaults that
    names one (`custom`, `/loader/custom`, `loader/dataset`)."""
    try:
        content = OmegaConf.to_container(OmegaConf.load(path))
    except Exception as error:  # noqa: BLE001 - any unreadable file: said in one line
        raise ConfigError(f"{path}: cannot be read as YAML ({error})") from error
    defaults = content.get("defaults", []) if isinstance(content, dict) else []
    for entry in defaults if isinstance(defaults, list) else []:
        if isinstance(entry, str):
            name = entry.split("@")[0].strip("/").removeprefix("loader/")
            if name in known:
                return name
    raise ConfigError(
        f"{path}: its defaults name none of facebench's loaders; start it with "
        "`defaults: [custom]` and a `dataset:` block holding your `_target_` (docs/own-pipeline.md)"
    )
