"""What travels between the server and the nodes: the message types, Flower's error codes
that mean a node is gone, numpy arrays in Flower's ``ArrayRecord``, and pickles loaded with a
restricted unpickler (only classes and registered client functions of trusted packages,
numpy arrays and a few builtins, so a peer cannot make the other side run arbitrary code)."""

from __future__ import annotations

import io
import pickle
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord

from ...data import DataError, FederatedData
from .remote import RemoteFederatedData

#: Flower error codes that mean the node (or its reply) is gone, not that the step failed
LOST_CODES = {3, 4, 5}  # MESSAGE_UNAVAILABLE, REPLY_MESSAGE_UNAVAILABLE, NODE_UNAVAILABLE
#: the message types: a run's messages, and the question a session asks each node when it starts
RUN, HELLO = "train.fedstats", "query.fedstats_hello"


_BUILTINS = {
    "dict",
    "list",
    "tuple",
    "set",
    "frozenset",
    "slice",
    "range",
    "complex",
    "float",
    "int",
    "bool",
    "str",
    "bytes",
    "bytearray",
    "object",
}
_NUMPY = {
    "numpy": {"ndarray", "dtype"},
    "numpy._core.multiarray": {"_reconstruct", "scalar"},
    "numpy._core.numeric": {"_frombuffer"},
    "numpy.core.numeric": {"_frombuffer"},
    "numpy.core.multiarray": {"_reconstruct", "scalar"},
    "numpy.random._pickle": {"__generator_ctor", "__bit_generator_ctor", "__randomstate_ctor"},
    "numpy.random._pcg64": {"PCG64", "PCG64DXSM"},
    "numpy.random._philox": {"Philox"},
    "numpy.random._mt19937": {"MT19937"},
    "numpy.random._sfc64": {"SFC64"},
    "numpy.random.bit_generator": {"SeedSequence", "__pyx_unpickle_SeedSequence"},
}
_OTHER = {
    ("copyreg", "_reconstructor"),
    ("collections", "OrderedDict"),
    ("collections", "defaultdict"),
    ("_codecs", "encode"),
}
_TORCH = {"device", "float64", "float32", "float16", "bfloat16", "int64", "int32"}


class _Pickler(pickle.Pickler):
    """Pickles a :class:`RemoteFederatedData` as a reference to 'the node's own data'."""

    def __init__(self, file):
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.saw_remote = False

    def persistent_id(self, obj):
        if isinstance(obj, RemoteFederatedData):
            self.saw_remote = True
            return "fedstats.node-data"
        return None


class _SafeUnpickler(pickle.Unpickler):
    def __init__(self, file, trust: Sequence[str], local: FederatedData | None = None):
        super().__init__(file)
        self.trust = tuple(trust)
        self.local = local

    def _trusted(self, module: str) -> bool:
        return any(module == t or module.startswith(t + ".") for t in self.trust)

    def persistent_load(self, pid):
        if pid == "fedstats.node-data" and self.local is not None:
            return self.local
        raise pickle.UnpicklingError(f"this payload refers to node data ({pid!r}) that is not available here")

    def find_class(self, module: str, name: str):
        ok = (
            (module == "builtins" and name in _BUILTINS)
            or name in _NUMPY.get(module, ())
            or (module, name) in _OTHER
            or (module == "numpy.dtypes" and name.endswith("DType"))
            or (module == "torch" and name in _TORCH)
        )
        if ok:
            return super().find_class(module, name)
        # a dotted name would walk attributes (fedstats.data -> np -> ... -> subprocess.Popen):
        # only a name defined in a trusted module itself is looked at
        if "." not in name and self._trusted(module):
            try:
                obj = super().find_class(module, name)
            except AttributeError:  # not a name of that module: refused below like any other
                obj = None
            # a class may be rebuilt (or constructed); a function is loaded only if registered
            if self._trusted(getattr(obj, "__module__", "") or "") and (
                isinstance(obj, type) or getattr(obj, "__fedstats_client_function__", False)
            ):
                return obj
        raise pickle.UnpicklingError(
            f"refusing to load {module}.{name}: not a class or registered client "
            f"function of {', '.join(self.trust)}, nor a numpy array"
        )


def dumps(obj: Any, *, remote: bool = False) -> bytes:
    """Pickle ``obj`` for the other side of a Flower run.

    A :class:`RemoteFederatedData` inside ``obj`` is written as a reference that the node
    replaces by its own data when it loads the pickle. ``remote=True`` requires one (a
    deployment's server must not send rows it might hold).
    """
    buf = io.BytesIO()
    pickler = _Pickler(buf)
    pickler.dump(obj)
    if remote and not pickler.saw_remote:
        raise DataError(
            "in a deployment the fit must be given session.remote_data() (or data built on it): the "
            "server holds no rows and sends none"
        )
    return buf.getvalue()


def loads(payload: bytes, trust: Sequence[str] = ("fedstats",), local: FederatedData | None = None) -> Any:
    """Load a pickle from the other side of a Flower run (restricted, see the module docs):
    classes and :func:`~fedstats.federation.client_function` functions of the packages in
    ``trust`` (your own :class:`~fedstats.federation.FederatedAlgorithm` lives in one), numpy
    arrays and plain builtins. ``local``: the node's own data, which stands in for the
    server's :class:`RemoteFederatedData`."""
    return _SafeUnpickler(io.BytesIO(payload), trust, local).load()


def to_arrays(record: ArrayRecord) -> dict[str, np.ndarray]:
    """The arrays of a Flower ``ArrayRecord``, as numpy arrays."""
    return {k: v.numpy() for k, v in record.items()}


def to_record(arrays: Mapping[str, np.ndarray]) -> ArrayRecord:
    """Numpy arrays as a Flower ``ArrayRecord``."""
    return ArrayRecord({k: Array(np.array(v, order="C")) for k, v in arrays.items()})  # keeps 0-d arrays 0-d
