"""The safe file format of fedstats's results (a leaf module: it imports no other part of
fedstats at import time).

* a zip archive holding ``fedstats.json`` (format name, version, the result's class and
  its state as JSON) and ``arrays.npz`` (every numeric array of that state);
* arrays are read with ``allow_pickle=False`` and the JSON with the standard parser; objects
  are rebuilt only from classes that fedstats registered as plain data
  (:func:`register`): a file cannot name a function, a module or any other class, so
  loading a file never runs code it names. A pickle, or a file naming anything else, is
  refused with :class:`ResultFileError` before anything in it is used.

:mod:`fedstats.results` re-exports these names; results save with ``result.save(path)``.
"""

from __future__ import annotations

import importlib
import io
import json
import math
import zipfile
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

__all__ = ["FORMAT", "VERSION", "ResultFileError", "register", "save_result", "load_result"]

_T = TypeVar("_T", bound=type)

FORMAT = "fedstats-result"
VERSION = 1

# Modules whose classes may appear in a result file. A name that is not registered after
# importing these is refused; the list is fixed here, never read from a file.
_MODULES = (
    "fedstats.federation.runner",
    "fedstats.inference.gaussian",
    "fedstats.inference.posterior",
    "fedstats.inference.ep",
    "fedstats.inference.tilted",
    "fedstats.data",
    "fedstats.linear",
    "fedstats.gp",
    "fedstats.mixture",
    "fedstats.glm",
    "fedstats.privacy",
)
_REGISTRY: dict[str, type] = {}


class ResultFileError(ValueError):
    """A file that is not a fedstats result this version can read, or that names something
    other than fedstats's registered data classes."""


def register(cls: _T) -> _T:
    """Class decorator: instances of ``cls`` may be written to and rebuilt from result files.

    Rebuilding creates the instance without calling ``__init__`` and sets its attributes
    (``__setstate__`` where the class defines one, which must only assign attributes). Only
    data classes belong here: state that is plain values, arrays and other registered objects.
    """
    name = cls.__qualname__
    if _REGISTRY.get(name, cls) is not cls:
        raise RuntimeError(f"two registered classes named {name}: {_REGISTRY[name]} and {cls}")
    _REGISTRY[name] = cls
    return cls


def _registered(name: str) -> type[object]:
    if name not in _REGISTRY:
        for mod in _MODULES:
            importlib.import_module(mod)
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ResultFileError(
            f"the file names {name!r}, which is not a fedstats data class: refused "
            "(result files can only rebuild fedstats's registered classes)"
        ) from None


# --------------------------------------------------------------------------- encoding
class _Encoder:
    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def array(self, a: np.ndarray) -> Any:
        if a.dtype.hasobject:
            return {"__list__": [self(x) for x in a.ravel().tolist()], "shape": list(a.shape)}
        key = f"a{len(self.arrays)}"
        self.arrays[key] = a
        return {"__array__": key}

    def __call__(self, x: Any, where: str = "state") -> Any:
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, (int, np.integer)) and not isinstance(x, np.bool_):
            return int(x)
        if isinstance(x, np.bool_):
            return bool(x)
        if isinstance(x, (float, np.floating)):
            x = float(x)
            return x if math.isfinite(x) else {"__float__": repr(x)}
        if isinstance(x, np.ndarray):
            return self.array(x)
        if isinstance(x, (list, tuple)):
            items = [self(v, f"{where}[{i}]") for i, v in enumerate(x)]
            return items if isinstance(x, list) else {"__tuple__": items}
        if isinstance(x, dict):
            return {"__dict__": [[self(k, where), self(v, f"{where}[{k!r}]")] for k, v in x.items()]}
        if isinstance(x, (set, frozenset)):
            return {"__set__": [self(v, where) for v in sorted(x, key=repr)], "frozen": isinstance(x, frozenset)}
        if isinstance(x, pd.DataFrame):
            return {
                "__frame__": {
                    "columns": self(list(x.columns)),
                    "index": self(list(x.index)),
                    "index_name": self(x.index.name),
                    "data": [self(x[c].to_numpy(), f"{where}[{c!r}]") for c in x.columns],
                }
            }
        if isinstance(x, pd.Series):
            return {"__series__": {"index": self(list(x.index)), "name": self(x.name), "data": self(x.to_numpy())}}
        cls = type(x)
        if _REGISTRY.get(cls.__qualname__) is cls:
            state = x.__getstate__()
            if isinstance(state, tuple):  # (dict, slots) for classes with __slots__
                raise TypeError(f"{where}: {cls.__qualname__} uses __slots__, which result files do not support")
            items = [[self(k, where), self(v, f"{where}.{k}")] for k, v in dict(state or {}).items()]
            return {"__object__": cls.__qualname__, "state": {"__dict__": items}}
        raise TypeError(
            f"{where}: cannot write a {cls.__module__}.{cls.__qualname__} to a result file "
            "(only numbers, strings, arrays, lists, dicts, data frames and fedstats's registered "
            "data classes)"
        )


def _decode(x: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    if isinstance(x, list):
        return [_decode(v, arrays) for v in x]
    if not isinstance(x, dict):
        return x
    if len(x) == 1 and "__array__" in x:
        return arrays[x["__array__"]]
    if "__list__" in x:
        out = np.empty(len(x["__list__"]), dtype=object)
        for i, v in enumerate(x["__list__"]):  # one by one: elements may be sequences themselves
            out[i] = _decode(v, arrays)
        return out.reshape(x["shape"])
    if "__float__" in x:
        return float(x["__float__"])
    if "__tuple__" in x:
        return tuple(_decode(v, arrays) for v in x["__tuple__"])
    if "__dict__" in x:
        return {_decode(k, arrays): _decode(v, arrays) for k, v in x["__dict__"]}
    if "__set__" in x:
        items = [_decode(v, arrays) for v in x["__set__"]]
        return frozenset(items) if x["frozen"] else set(items)
    if "__frame__" in x:
        f = x["__frame__"]
        cols = _decode(f["columns"], arrays)
        df = pd.DataFrame(
            {i: _decode(d, arrays) for i, d in enumerate(f["data"])},
            index=pd.Index(_decode(f["index"], arrays), name=_decode(f["index_name"], arrays)),
        )
        df.columns = cols
        return df
    if "__series__" in x:
        s = x["__series__"]
        return pd.Series(_decode(s["data"], arrays), index=_decode(s["index"], arrays), name=_decode(s["name"], arrays))
    if "__object__" in x:
        cls = _registered(x["__object__"])
        state = _decode(x["state"], arrays)
        obj: Any = cls.__new__(cls)
        if hasattr(cls, "__setstate__"):
            obj.__setstate__(state)
        else:
            obj.__dict__.update(state)
        return obj
    raise ResultFileError(f"unknown entry in the result file: {sorted(x)[:3]}")


# --------------------------------------------------------------------------- files
def save_result(obj: Any, path: str | PathLike[str]) -> Path:
    """Write the registered result ``obj`` to ``path`` (the format of the module docs)."""
    enc = _Encoder()
    from . import __version__

    body = {"format": FORMAT, "version": VERSION, "fedstats": __version__, "result": enc(obj, type(obj).__name__)}
    if not isinstance(body["result"], dict) or "__object__" not in body["result"]:
        raise TypeError(f"{type(obj).__qualname__} is not a registered result class")
    buf = io.BytesIO()
    # the keys are "a0", "a1", ...: never savez's own keyword allow_pickle, which the stub fears
    np.savez(buf, **enc.arrays)  # type: ignore[arg-type]
    path = Path(path)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        z.writestr("fedstats.json", json.dumps(body, allow_nan=False))
        z.writestr("arrays.npz", buf.getvalue())
    return path


def load_result(path: str | PathLike[str], expected: type | None = None) -> Any:
    """The result written by :func:`save_result`; with ``expected``, it must be an instance of
    that class. Raises :class:`ResultFileError` for anything else (a pickle, another format or
    version, a file naming an unregistered class) without executing anything from the file."""
    path = Path(path)
    if not zipfile.is_zipfile(path):
        raise ResultFileError(
            f"{path} is not a fedstats result file (expected a zip archive written by save(); "
            "pickles of older versions are not read)"
        )
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        if not {"fedstats.json", "arrays.npz"} <= names:
            raise ResultFileError(f"{path} is not a fedstats result file (members {sorted(names)[:4]})")
        try:
            body = json.loads(z.read("fedstats.json"))
        except ValueError as exc:
            raise ResultFileError(f"{path}: unreadable header ({exc})") from None
        if not isinstance(body, dict) or body.get("format") != FORMAT:
            raise ResultFileError(f"{path} is not a fedstats result file")
        if not isinstance(body.get("version"), int) or body["version"] > VERSION:
            raise ResultFileError(
                f"{path} has format version {body.get('version')!r}; this fedstats reads versions up to {VERSION}"
            )
        try:
            with np.load(io.BytesIO(z.read("arrays.npz")), allow_pickle=False) as npz:
                arrays = {k: npz[k] for k in npz.files}
        except ValueError as exc:
            raise ResultFileError(f"{path}: arrays refused ({exc})") from None
    res = body.get("result")
    if not isinstance(res, dict) or "__object__" not in res:
        raise ResultFileError(f"{path} holds no result")
    cls = _registered(res["__object__"])
    if expected is not None and not issubclass(cls, expected):
        raise ResultFileError(f"{path} holds a {cls.__qualname__}, not a {expected.__qualname__}")
    try:
        return _decode(res, arrays)
    except ResultFileError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ResultFileError(f"{path}: malformed result file ({type(exc).__name__}: {exc})") from None
