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
import re
import struct
import zipfile
import zlib
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from ._version import __version__

__all__ = ["FORMAT", "VERSION", "ResultFileError", "register", "save_result", "load_result"]

_T = TypeVar("_T", bound=type)

FORMAT = "fedstats-result"
VERSION = 1

_REGISTRY: dict[str, type] = {}

#: registered classes renamed since files were first written (former name -> name now): a
#: file that names a class by its former name still loads
FORMER_NAMES = {
    "DevicePosterior": "ClientPosterior",
    "_HM1Device": "_HM1Client",
    "CentralisedShrinkageResult": "CentralizedShrinkageResult",
    "AR1Level": "AR1Fidelity",
    "NARGPLevel": "NARGPFidelity",
}


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


_INDEX: dict[str, str] = {}
_DECLARED = re.compile(r"^@register[ \t]*\n(?:@.*\n)*class[ \t]+(\w+)", re.MULTILINE)


def _index() -> dict[str, str]:
    """Every class fedstats registers, by name: the module that defines it, found by reading
    (not importing) fedstats's sources once."""
    if not _INDEX:
        root = Path(__file__).parent
        for p in sorted(root.rglob("*.py")):
            text = p.read_text(encoding="utf-8")
            if "@register" in text:
                module = ".".join(("fedstats", *p.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
                _INDEX.update((name, module) for name in _DECLARED.findall(text))
    return _INDEX


def _registered(name: str) -> type[object]:
    """The registered class ``name``; only the one module that defines it is imported, and a
    name no fedstats module registers is refused without importing anything."""
    name = FORMER_NAMES.get(name, name)
    if name not in _REGISTRY and name in _index():
        importlib.import_module(_index()[name])
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
        former = getattr(cls, "_former_attributes", {})  # attributes renamed since the file was written
        if former and isinstance(state, dict):
            state = {former.get(k, k): v for k, v in state.items()}
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


# --------------------------------------------------------------------------- bounded reading
#: the largest header (``fedstats.json``) :func:`load_result` reads: a result's header holds
#: names, options and tables of numbers written as arrays, a few hundred kB at most
MAX_HEADER_BYTES = 8 * 2**20
#: the deepest nesting of the header's JSON (a result's own is about 30)
MAX_DEPTH = 200
#: the default bound on the bytes of a result's arrays together (``load_result(max_bytes=)``)
MAX_ARRAY_BYTES = 2**30
_CHUNK = 2**24


def _entries(f: Any, most: int, what: str, expected: str) -> None:
    """Refuse a zip archive whose end record declares more than ``most`` members (read from
    the end record, before :mod:`zipfile` builds its directory)."""
    f.seek(0, 2)
    size = f.tell()
    k = min(size, 22 + 65535)
    f.seek(size - k)
    tail = f.read(k)
    i = tail.rfind(b"PK\x05\x06")
    if i < 0 or len(tail) < i + 22:
        raise ResultFileError(f"{what} is not a zip archive")
    (entries,) = struct.unpack("<H", tail[i + 10 : i + 12])
    if entries > most:
        raise ResultFileError(f"{what} holds {entries} members; {expected}")
    f.seek(0)


def _walk(res: Any, where: Path) -> tuple[set[str], set[str]]:
    """The array keys and class names the header's result uses; refuses nesting deeper than
    :data:`MAX_DEPTH` and entries of the wrong type (before anything is read or imported)."""
    refs: set[str] = set()
    names: set[str] = set()
    stack = [(res, 0)]
    while stack:
        x, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ResultFileError(f"{where}: the header nests deeper than {MAX_DEPTH} levels")
        if isinstance(x, list):
            stack.extend((v, depth + 1) for v in x)
        elif isinstance(x, dict):
            for key, bag in (("__array__", refs), ("__object__", names)):
                if key in x:
                    if not isinstance(x[key], str):
                        raise ResultFileError(f"{where}: malformed result file ({key} is a {type(x[key]).__name__})")
                    bag.add(x[key])
            stack.extend((v, depth + 1) for v in x.values())
    return refs, names


def _read_array(f: Any, size: int, budget: int, key: str) -> np.ndarray:
    """One ``.npy`` member of ``size`` bytes: its header checked against the bytes present and
    the remaining ``budget``, then its data read in chunks (no pickles, no object arrays)."""
    version = np.lib.format.read_magic(f)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(f, max_header_size=10000)
    elif version == (2, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(f, max_header_size=10000)
    else:
        raise ResultFileError(f"arrays refused (array {key!r} has .npy version {version})")
    if dtype.hasobject:
        raise ResultFileError(f"arrays refused (array {key!r} holds Python objects, which would need a pickle)")
    count = math.prod(int(n) for n in shape)
    nbytes = count * dtype.itemsize
    if f.tell() + nbytes != size:
        raise ResultFileError(
            f"arrays refused (array {key!r} declares shape {tuple(shape)}, {nbytes} bytes; the file holds "
            f"{size - f.tell()})"
        )
    if nbytes > budget:
        raise ResultFileError(
            f"the arrays hold more than max_bytes bytes (array {key!r} alone {nbytes}); pass a larger "
            "max_bytes to read them"
        )
    out = np.empty(count, dtype)
    raw = out.view(np.uint8) if nbytes else np.empty(0, np.uint8)
    done = 0
    while done < nbytes:
        chunk = f.read(min(_CHUNK, nbytes - done))
        if not chunk:
            raise ResultFileError(f"arrays refused (array {key!r} is truncated)")
        raw[done : done + len(chunk)] = np.frombuffer(chunk, np.uint8)
        done += len(chunk)
    return out.reshape(shape, order="F" if fortran else "C")


def _read_arrays(z: zipfile.ZipFile, refs: set[str], max_bytes: int, where: Path) -> dict[str, np.ndarray]:
    info = z.getinfo("arrays.npz")
    if info.file_size > max_bytes + 4096 * (len(refs) + 1):
        raise ResultFileError(
            f"{where}: arrays.npz holds {info.file_size} bytes, more than max_bytes={max_bytes} "
            "(pass a larger max_bytes to read it)"
        )
    arrays: dict[str, np.ndarray] = {}
    budget = max_bytes
    with z.open(info) as f:
        _entries(f, len(refs), f"{where}: arrays.npz", f"the result uses {len(refs)} arrays (refused unread)")
        with zipfile.ZipFile(f) as npz:
            members = {i.filename: i for i in npz.infolist()}
            extra = sorted(set(members) - {k + ".npy" for k in refs})
            if extra:
                raise ResultFileError(f"{where}: arrays.npz holds arrays no part of the result uses: {extra[:5]}")
            missing = sorted(refs - {m.removesuffix(".npy") for m in members})
            if missing:
                raise ResultFileError(f"{where}: malformed result file (no array {missing[0]!r} in arrays.npz)")
            # in the order they are stored: the archive is read forwards once
            for m in sorted(members.values(), key=lambda i: i.header_offset):
                key = m.filename.removesuffix(".npy")
                with npz.open(m) as a:
                    arrays[key] = _read_array(a, m.file_size, budget, key)
                budget -= arrays[key].nbytes
    return arrays


def load_result(path: str | PathLike[str], expected: type | None = None, *, max_bytes: int = MAX_ARRAY_BYTES) -> Any:
    """The result written by :func:`save_result`; with ``expected``, it must be an instance of
    that class. Raises :class:`ResultFileError` for anything else (a pickle, another format or
    version, a file naming an unregistered class, a malformed or corrupted file) without
    executing anything from the file.

    Reading is bounded: a header of at most :data:`MAX_HEADER_BYTES` nested at most
    :data:`MAX_DEPTH` deep, arrays of at most ``max_bytes`` bytes together (default 1 GiB),
    each array's declared shape checked against the bytes present before it is read, and no
    array the result does not use. A class name is looked up in fedstats's sources, so
    refusing an unknown one imports nothing."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            if not zipfile.is_zipfile(f):
                raise ResultFileError(
                    f"{path} is not a fedstats result file (expected a zip archive written by save(); "
                    "pickles of older versions are not read)"
                )
            _entries(f, 2, str(path), "a result file holds 2")
            with zipfile.ZipFile(f) as z:
                return _load(z, path, expected, max_bytes)
    except ResultFileError:
        raise
    except OSError as exc:
        raise ResultFileError(f"{path}: cannot read it ({exc})") from None
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, struct.error) as exc:
        raise ResultFileError(f"{path}: corrupted file ({type(exc).__name__}: {exc})") from None


def _load(z: zipfile.ZipFile, path: Path, expected: type | None, max_bytes: int) -> Any:
    names = set(z.namelist())
    if names != {"fedstats.json", "arrays.npz"}:
        raise ResultFileError(f"{path} is not a fedstats result file (members {sorted(names)[:4]})")
    head = z.getinfo("fedstats.json")
    if head.file_size > MAX_HEADER_BYTES:
        raise ResultFileError(
            f"{path}: its header holds {head.file_size} bytes; a result's header holds at most {MAX_HEADER_BYTES}"
        )
    with z.open(head) as h:
        raw = h.read(MAX_HEADER_BYTES + 1)
    try:
        body = json.loads(raw)
    except RecursionError:
        raise ResultFileError(f"{path}: the header nests deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:
        raise ResultFileError(f"{path}: unreadable header ({exc})") from None
    if not isinstance(body, dict) or body.get("format") != FORMAT:
        raise ResultFileError(f"{path} is not a fedstats result file")
    version = body.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version > VERSION:
        raise ResultFileError(f"{path} has format version {version!r}; this fedstats reads versions up to {VERSION}")
    res = body.get("result")
    if not isinstance(res, dict) or not isinstance(res.get("__object__"), str):
        raise ResultFileError(f"{path} holds no result")
    refs, classes = _walk(res, path)
    cls = _registered(res["__object__"])
    if expected is not None and not issubclass(cls, expected):
        raise ResultFileError(f"{path} holds a {cls.__qualname__}, not a {expected.__qualname__}")
    for name in sorted(classes):  # every class, before any array is read
        _registered(name)
    arrays = _read_arrays(z, refs, max_bytes, path)
    try:
        return _decode(res, arrays)
    except ResultFileError:
        raise
    except RecursionError:
        raise ResultFileError(f"{path}: the header nests too deep") from None
    except Exception as exc:  # noqa: BLE001 - whatever a malformed state makes a class raise
        raise ResultFileError(f"{path}: malformed result file ({type(exc).__name__}: {exc})") from None
