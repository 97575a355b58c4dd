"""Capture recipes: real applications on a filesystem on a device, traced with `capture`.

`RECIPES` maps a recipe's name to its module. Each module exposes `DESCRIPTION` (one
sentence), `KNOBS` ({name: (type, default, help)}) and
`run(device, output, *, notices, destroy_data=False, backend="auto", **knobs) -> CaptureResult`,
built on `traces.capture.recipes.common`. Modules are imported only when used.
"""
import importlib
import importlib.util
from types import ModuleType

from traces.capture.recipes.common import RecipeError

__all__ = ["RECIPES", "RecipeError", "load", "names"]

RECIPES = {
    "oltp": "traces.capture.recipes.oltp",
    "blob": "traces.capture.recipes.blob",
    "blobclosed": "traces.capture.recipes.blobclosed",
    "boot": "traces.capture.recipes.boot",
    "filecopy": "traces.capture.recipes.filecopy",
    "build": "traces.capture.recipes.build",
    "gitclone": "traces.capture.recipes.gitclone",
    "dpkg": "traces.capture.recipes.dpkg",
    "mariadb": "traces.capture.recipes.mariadb",
    "rocksdb": "traces.capture.recipes.rocksdb",
    "photos": "traces.capture.recipes.photos",
    "video": "traces.capture.recipes.video",
    "web": "traces.capture.recipes.web",
    "office": "traces.capture.recipes.office",
}


def names() -> list[str]:
    """Recipes whose module is present in this installation, sorted."""
    return sorted(n for n in RECIPES if importlib.util.find_spec(RECIPES[n]) is not None)


def load(name: str) -> ModuleType:
    """The module of recipe `name`; an unknown name raises RecipeError listing the recipes."""
    if name not in RECIPES or importlib.util.find_spec(RECIPES[name]) is None:
        raise RecipeError(f"no recipe named {name!r}; the recipes are: {', '.join(names())}")
    return importlib.import_module(RECIPES[name])
