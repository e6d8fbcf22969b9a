"""The safe result format (fedstats.results): every model's result survives save/load exactly,
and a crafted file is refused without running anything it names."""

from __future__ import annotations

import io
import json
import pickle
import warnings
import zipfile

import numpy as np
import pandas as pd
import pytest

from fedstats.result_file import _REGISTRY, MAX_HEADER_BYTES, _index
from fedstats.results import ResultFileError, load_result, save_result


def same(a, b, where="state"):
    """Deep equality of two decoded states (arrays bit for bit, NaN equal to NaN)."""
    assert type(a) is type(b), f"{where}: {type(a)} != {type(b)}"
    if isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, where
        if a.dtype.kind in "fc":
            assert np.array_equal(a, b, equal_nan=True), where
        elif a.dtype.hasobject:
            for i, (x, y) in enumerate(zip(a.ravel(), b.ravel())):
                same(x, y, f"{where}[{i}]")
        else:
            assert np.array_equal(a, b), where
    elif isinstance(a, float):
        assert a == b or (np.isnan(a) and np.isnan(b)), where
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    elif isinstance(a, pd.DataFrame):
        pd.testing.assert_frame_equal(a, b)
    elif type(a).__qualname__ in _REGISTRY:
        same(a.__getstate__(), b.__getstate__(), f"{where}.{type(a).__qualname__}")
    else:
        assert a == b, where


def test_save_load_round_trip_is_exact(fitted, model_name, tmp_path):
    name = model_name
    results, data, _ = fitted
    res = results[name]
    path = res.save(tmp_path / "fit.fedstats")
    assert zipfile.is_zipfile(path)
    with zipfile.ZipFile(path) as z:
        assert sorted(z.namelist()) == ["arrays.npz", "fedstats.json"]
        header = json.loads(z.read("fedstats.json"))  # strict JSON: no NaN or Infinity
        assert header["format"] == "fedstats-result" and header["version"] == 1
        raw = z.read("fedstats.json").decode()
    assert len(raw) < MAX_HEADER_BYTES / 16  # load_result's bound on a header leaves room
    assert "NaN" not in raw and "Infinity" not in raw
    back = type(res).load(path)
    assert type(back) is type(res)
    same(res.__getstate__() if hasattr(res, "__getstate__") else res.__dict__, back.__getstate__())
    # and it still works: the same tables as the original
    if name.startswith("fem-omd") is False and hasattr(res, "summary"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pd.testing.assert_frame_equal(res.summary(), back.summary())


def test_every_registered_class_is_found_in_the_sources():
    # load_result imports only the module its index names: the index (read from the sources)
    # must name every class registered once every model is imported
    import fedstats.federation.checkpoints  # noqa: F401
    import fedstats.glm  # noqa: F401
    import fedstats.gp  # noqa: F401
    import fedstats.inference.tilted  # noqa: F401
    import fedstats.linear  # noqa: F401
    import fedstats.mixture  # noqa: F401
    import fedstats.privacy  # noqa: F401

    ours = {n: c for n, c in _REGISTRY.items() if c.__module__.startswith("fedstats.")}  # not the tests' own
    missing = {n: c.__module__ for n, c in ours.items() if _index().get(n) != c.__module__}
    assert not missing and len(ours) >= 50


def test_no_client_rows_in_files(fitted, tmp_path):
    # FGPR keeps the training data for in-process predictions; the file never holds it
    results, data, _ = fitted
    path = results["fgpr"].save(tmp_path / "fgpr.fedstats")
    with zipfile.ZipFile(path) as z, np.load(io.BytesIO(z.read("arrays.npz"))) as npz:
        sizes = [npz[k].size for k in npz.files]
    assert max(sizes, default=0) < data.n_total
    assert type(results["fgpr"]).load(path)._data is None


def test_loading_a_pickle_runs_nothing(tmp_path):
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    path = tmp_path / "fit.pkl"
    path.write_bytes(pickle.dumps({"format": 1, "state": Payload()}))
    from fedstats.linear import HierarchicalResult

    with pytest.raises(ResultFileError, match="not a fedstats result file"):
        HierarchicalResult.load(path)
    assert not marker.exists()


def crafted(path, result, arrays=None, **header):
    body = {"format": "fedstats-result", "version": 1, "fedstats": "0", "result": result, **header}
    buf = io.BytesIO()
    np.savez(buf, **(arrays or {}))
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("fedstats.json", json.dumps(body))
        z.writestr("arrays.npz", buf.getvalue())
    return path


@pytest.mark.parametrize(
    "name", ["system", "os.system", "posix.system", "subprocess.Popen", "builtins.eval", "FederatedData", "__import__"]
)
def test_a_file_naming_a_callable_is_refused(tmp_path, name):
    path = crafted(tmp_path / "evil.fedstats", {"__object__": name, "state": {"__dict__": [["cmd", "touch x"]]}})
    with pytest.raises(ResultFileError, match="not a fedstats data class"):
        load_result(path)
    # nested inside a registered class too
    path = crafted(
        tmp_path / "evil2.fedstats",
        {
            "__object__": "PointResult",
            "state": {"__dict__": [["theta", {"__object__": name, "state": {"__dict__": []}}]]},
        },
    )
    with pytest.raises(ResultFileError, match="not a fedstats data class"):
        load_result(path)
    assert not (tmp_path / "x").exists()


def test_pickled_arrays_and_other_versions_are_refused(tmp_path):
    obj = np.empty(1, dtype=object)
    obj[0] = {"a": 1}
    path = crafted(
        tmp_path / "a.fedstats",
        {"__object__": "PointResult", "state": {"__dict__": [["theta", {"__array__": "a0"}]]}},
        arrays={"a0": obj},
    )
    with pytest.raises(ResultFileError, match="arrays refused"):
        load_result(path)
    with pytest.raises(ResultFileError, match="version"):
        load_result(
            crafted(tmp_path / "b.fedstats", {"__object__": "PointResult", "state": {"__dict__": []}}, version=2)
        )
    from fedstats.linear import HierarchicalResult

    with pytest.raises(ResultFileError, match="holds a PointResult, not a HierarchicalResult"):
        HierarchicalResult.load(
            crafted(tmp_path / "c.fedstats", {"__object__": "PointResult", "state": {"__dict__": []}})
        )


def test_codec_keeps_key_types_and_non_finite_values(fitted, tmp_path):
    res = fitted[0]["separate"]
    res.options = {**res.options, "odd": {1: np.inf, "1": -np.inf, (2, "b"): np.nan, "s": {3, 4}}}
    try:
        back = type(res).load(res.save(tmp_path / "p.fedstats"))
    finally:
        res.options = {k: v for k, v in res.options.items() if k != "odd"}
    odd = back.options["odd"]
    assert odd[1] == np.inf and odd["1"] == -np.inf and np.isnan(odd[(2, "b")]) and odd["s"] == {3, 4}


def test_unwritable_state_names_where(tmp_path):
    from fedstats.linear.local import PointResult

    res = PointResult(feature_names=["a"], clients=[0], theta=np.zeros((1, 1)), options={"hook": print})
    with pytest.raises(
        TypeError, match=r"^PointResult.options\['hook'\]: cannot write a builtins.builtin_function_or_method"
    ):
        save_result(res, tmp_path / "x.fedstats")


def test_object_arrays_and_malformed_files(tmp_path):
    from fedstats.linear.local import PointResult

    names = np.empty((2, 2), dtype=object)
    names[:] = [["a", (1, 2)], [None, "d"]]
    res = PointResult(feature_names=["a"], clients=[0], theta=np.zeros((1, 1)), options={"names": names})
    back = PointResult.load(res.save(tmp_path / "o.fedstats"))
    same(res.__getstate__(), back.__getstate__())
    with pytest.raises(ResultFileError, match="malformed"):
        load_result(
            crafted(
                tmp_path / "m.fedstats",
                {"__object__": "PointResult", "state": {"__dict__": [["theta", {"__array__": "missing"}]]}},
            )
        )


# the results whose fit communicates (FEM-OMD's result() counts every step so far; the
# centralised lasso pools rows in one process; FEM-OMD itself is a model, not a result)
def test_communication_counts_every_exchange_of_the_fit(fitted, counted_name):
    name = counted_name
    results, data, runs = fitted
    c = results[name].communication
    up, down = runs[name]  # every round of every run during the fit, from the runtime's records
    kinds = c.by_kind
    hand = kinds.get("posterior blocks", {"bytes_up": 0, "bytes_down": 0})  # HM1: computed on the server
    assert (c.bytes_up, c.bytes_down - hand["bytes_down"]) == (up, down), kinds
    assert c.bytes_up == sum(v["bytes_up"] for v in kinds.values())
    assert c.bytes_down == sum(v["bytes_down"] for v in kinds.values())
    assert sum(p["bytes_up"] for p in c.per_client.values()) == c.bytes_up
    assert c.breakdown().index.name == "kind" and list(c.breakdown().columns) == [
        "bytes_up",
        "bytes_down",
        "rounds",
        "runs",
    ]
    if name in ("fedem", "vb-fedem", "d-fedem"):  # the federated k-means start is counted too
        assert "k-means initialisation" in kinds and kinds["k-means initialisation"]["bytes_up"] > 0
    if name in ("lasso", "ridge"):
        assert "design check" in kinds
