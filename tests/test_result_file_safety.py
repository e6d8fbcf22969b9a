"""Crafted result files are refused with ResultFileError in bounded time and memory (issue 41,
item 6): compression bombs in the header and in the arrays, shapes that do not match the bytes,
deep or oddly typed JSON, corrupted archives, and classes that fedstats does not register."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time
import tracemalloc
import zipfile

import numpy as np
import pytest

from fedstats.result_file import MAX_HEADER_BYTES, ResultFileError, load_result, save_result

MiB = 2**20
SECONDS, PEAK = 10.0, 300 * MiB


def refused(path, match, **kw):
    """load_result refuses ``path`` with ``match``; the time and the peak of traced memory."""
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(ResultFileError, match=match):
            load_result(path, **kw)
        took = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert took < SECONDS, f"{took:.1f} s"
    assert peak < PEAK, f"{peak / MiB:.0f} MiB"
    return took, peak


def header(result, **extra):
    return {"format": "fedstats-result", "version": 1, "fedstats": "0", "result": result, **extra}


def point():
    from fedstats.linear.local import PointResult

    return PointResult(feature_names=["a", "b"], clients=[0, 1], theta=np.arange(4.0).reshape(2, 2), options={})


def write(path, head: bytes | str, arrays: bytes, compression=zipfile.ZIP_DEFLATED):
    with zipfile.ZipFile(path, "w", compression=compression) as z:
        z.writestr("fedstats.json", head)
        z.writestr("arrays.npz", arrays)
    return path


def npz(**arrays) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def streamed(z: zipfile.ZipFile, name: str, first: bytes, fill: int, size: int) -> None:
    """Write member ``name``: ``first``, then ``size`` bytes of ``fill``, in chunks (a bomb:
    it deflates to about a thousandth)."""
    chunk = bytes([fill]) * (16 * MiB)
    with z.open(name, "w", force_zip64=True) as f:
        f.write(first)
        left = size
        while left:
            f.write(chunk[: min(left, len(chunk))])
            left -= min(left, len(chunk))


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return save_result(point(), tmp_path_factory.mktemp("files") / "good.fedstats")


def test_a_good_file_still_loads(good):
    back = load_result(good)
    assert np.array_equal(back.theta, np.arange(4.0).reshape(2, 2))


@pytest.mark.parametrize("size", [256 * MiB, 1024 * MiB], ids=["256MiB", "1GiB"])
def test_an_inflating_header_is_refused_unread(tmp_path, size):
    path = tmp_path / "bomb.fedstats"
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        streamed(z, "fedstats.json", json.dumps(header({"__object__": "PointResult"}))[:-1].encode(), 32, size)
        z.writestr("arrays.npz", npz())
    assert path.stat().st_size < size / 100
    refused(path, "header holds")


def test_a_hidden_array_is_refused(tmp_path, good):
    with zipfile.ZipFile(good) as z:
        head, arrays = z.read("fedstats.json"), z.read("arrays.npz")
    with np.load(io.BytesIO(arrays)) as f:
        kept = {k: f[k] for k in f.files}
    refused(
        write(tmp_path / "small.fedstats", head, npz(**kept, extra=np.ones(3))), "holds 2 members; the result uses 1"
    )

    # 1 GiB of zeros in arrays.npz, which no part of the result names: refused unread (by the
    # archive's end record), and by its size under a smaller max_bytes
    path = tmp_path / "hidden.fedstats"
    size = 1024 * MiB
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        z.writestr("fedstats.json", head)
        with z.open("arrays.npz", "w", force_zip64=True) as inner_file:
            with zipfile.ZipFile(inner_file, "w") as inner:
                for k, v in kept.items():
                    inner.writestr(k + ".npy", _npy(v))
                hdr = io.BytesIO()
                np.lib.format.write_array_header_1_0(
                    hdr, {"descr": "<f8", "fortran_order": False, "shape": (size // 8,)}
                )
                streamed(inner, "hidden.npy", b"\x93NUMPY\x01\x00" + hdr.getvalue()[8:], 0, size)
    assert path.stat().st_size < 8 * MiB
    refused(path, "holds 2 members; the result uses 1")
    refused(path, "more than max_bytes", max_bytes=size // 2)
    # an array under the name of one the result uses, beside it: refused by name
    renamed = kept | {"a1": np.ones(2)}
    refused(write(tmp_path / "renamed.fedstats", head, npz(**renamed)), "holds 2 members")
    refused(write(tmp_path / "other.fedstats", head, npz(zz=np.ones(2))), "no part of the result uses")


def _npy(a) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, a)
    return buf.getvalue()


def test_a_shape_larger_than_its_bytes_is_refused(tmp_path):
    head = json.dumps(header({"__object__": "PointResult", "state": {"__dict__": [["theta", {"__array__": "a0"}]]}}))
    for shape in [(10**11,), (10**6, 10**6), (3,)]:
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False, "shape": shape})
        member = buf.getvalue() + np.zeros(2).tobytes()
        arrays = io.BytesIO()
        with zipfile.ZipFile(arrays, "w") as z:
            z.writestr("a0.npy", member)
        refused(write(tmp_path / "shape.fedstats", head, arrays.getvalue()), "declares shape")


@pytest.mark.parametrize("depth", [250, 600, 100_000])
def test_deep_json_is_refused(tmp_path, depth):
    nested = "[" * depth + "]" * depth
    head = json.dumps(header({"__object__": "PointResult", "state": {"__dict__": [["x", "@"]]}})).replace('"@"', nested)
    refused(write(tmp_path / "deep.fedstats", head, npz()), "nests deeper")


@pytest.mark.parametrize(
    "result, match",
    [
        ({"__object__": ["PointResult"]}, "holds no result"),
        ({"__object__": {"a": 1}}, "holds no result"),
        ({"__object__": "PointResult", "state": {"__dict__": [["x", {"__object__": 3}]]}}, "malformed"),
        ({"__object__": "PointResult", "state": {"__dict__": [["x", {"__array__": ["a0"]}]]}}, "malformed"),
        ({"__object__": "PointResult", "state": {"__dict__": "theta"}}, "malformed"),
        (
            {"__object__": "PointResult", "state": {"__dict__": [["x", {"__list__": [1, 2], "shape": [10**9]}]]}},
            "malformed",
        ),
        ({"__object__": "PointResult", "state": {"__dict__": [["x", {"__list__": 7, "shape": "x"}]]}}, "malformed"),
        ({"__object__": "PointResult", "state": {"__dict__": [[["k"], 1]]}}, "malformed"),
        ({"__object__": "PointResult", "state": {"__dict__": [["x", {"__float__": "nanx"}]]}}, "malformed"),
        (
            {"__object__": "PointResult", "state": {"__dict__": [["x", {"__set__": [[1]], "frozen": True}]]}},
            "malformed",
        ),
        ({"__object__": "PointResult", "state": {"__dict__": [["x", {"__frame__": 1}]]}}, "malformed"),
        ({"__object__": "PointResult", "state": [1, 2]}, "malformed"),
    ],
)
def test_odd_json_types_are_refused(tmp_path, result, match):
    refused(write(tmp_path / "odd.fedstats", json.dumps(header(result)), npz()), match)


@pytest.mark.parametrize(
    "head, match",
    [
        ([1, 2], "not a fedstats result file"),
        (header({"__object__": "PointResult"}, version="1"), "version"),
        (header({"__object__": "PointResult"}, version=True), "version"),
        ({"format": ["fedstats-result"]}, "not a fedstats result file"),
    ],
)
def test_odd_headers_are_refused(tmp_path, head, match):
    refused(write(tmp_path / "odd.fedstats", json.dumps(head), npz()), match)


def test_corrupted_and_truncated_archives_are_refused(tmp_path, good):
    raw = good.read_bytes()
    with zipfile.ZipFile(good) as z:
        info = z.getinfo("fedstats.json")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    bad = bytearray(raw)
    bad[start + info.compress_size // 2] ^= 0xFF  # a byte of the deflated header: a CRC (or deflate) error
    (tmp_path / "crc.fedstats").write_bytes(bytes(bad))
    refused(tmp_path / "crc.fedstats", "corrupted|unreadable")
    for cut in (len(raw) // 2, len(raw) - 10, 30):
        (tmp_path / "cut.fedstats").write_bytes(raw[:cut])
        refused(tmp_path / "cut.fedstats", "not a fedstats result file|corrupted|not a zip")
    (tmp_path / "empty.fedstats").write_bytes(b"")
    refused(tmp_path / "empty.fedstats", "not a fedstats result file")
    refused(tmp_path / "missing.fedstats", "cannot read it")


def test_an_archive_of_many_members_is_refused_before_its_directory_is_read(tmp_path):
    path = tmp_path / "many.fedstats"
    with zipfile.ZipFile(path, "w") as z:
        for i in range(20_000):
            z.writestr(f"m{i}", b"")
    refused(path, "holds 20000 members")


def test_the_header_limit_is_documented_and_generous():
    # a result's header holds names, options and small tables (arrays go to arrays.npz): the
    # largest in the suite's fitted results is far below the limit (checked in test_results)
    assert MAX_HEADER_BYTES == 8 * MiB


def test_refusing_an_unknown_class_imports_no_model(tmp_path):
    path = write(tmp_path / "unknown.fedstats", json.dumps(header({"__object__": "NotAModel"})), npz())
    code = (
        "import sys, time\n"
        "from fedstats.results import ResultFileError, load_result\n"
        "before = set(sys.modules)\n"
        "t0 = time.perf_counter()\n"
        "try:\n"
        f"    load_result({str(path)!r})\n"
        "except ResultFileError as exc:\n"
        "    assert 'not a fedstats data class' in str(exc), exc\n"
        "took = time.perf_counter() - t0\n"
        "new = sorted(m for m in set(sys.modules) - before if m.startswith(('fedstats', 'jax', 'torch')))\n"
        "print(took, new)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ)
    took, new = out.stdout.split(" ", 1)
    assert float(took) < 1.0
    assert new.strip() == "[]"
