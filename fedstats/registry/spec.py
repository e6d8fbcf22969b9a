"""The parts of a model's declaration (:class:`Declaration`): what its clients send
(:class:`Disclosure`, :class:`Exchange`, :class:`Array`), how the command line builds and
reports it (:class:`Command`, :class:`Option`) and its small fits for the tests
(:class:`Example`). Plain frozen data classes; nothing here imports a model.

Example
-------
>>> from fedstats.registry.spec import Array, Exchange
>>> e = Exchange("design check", "OneShotSums", "once", (Array("n", "row count"),), ("n",))
>>> e.keys, e.summed
(('n',), ('n',))
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Array",
    "Command",
    "CLIError",
    "Declaration",
    "Disclosure",
    "Example",
    "Exchange",
    "Expect",
    "Option",
    "load",
]


def load(path: str) -> Any:
    """The object a ``"module:attribute"`` path names, imported only now.

    >>> load("fedstats.registry.spec:load") is load
    True
    """
    module, _, attr = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in attr.split(".") if attr else ():
        obj = getattr(obj, part)
    return obj


# --------------------------------------------------------------------------- disclosure
@dataclass(frozen=True)
class Array:
    """One reply array: its key, what it is, and (per client) what one copy of it reveals."""

    key: str
    what: str
    reveals: str = ""


@dataclass(frozen=True)
class Exchange:
    """One run of the runtime within a fit.

    ``kind`` is its label in ``communication.by_kind``, ``algorithm`` the class name of the
    algorithm the runtime runs, ``when`` the condition or schedule (every round, once before
    the rounds, with an option), ``arrays`` the reply arrays and ``summed`` the keys the
    algorithm declares summed (it must declare exactly these: a test checks it)."""

    kind: str
    algorithm: str
    when: str
    arrays: tuple[Array, ...]
    summed: tuple[str, ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        """The reply keys, in declaration order."""
        return tuple(a.key for a in self.arrays)

    def __post_init__(self) -> None:
        unknown = set(self.summed) - set(self.keys)
        if unknown:
            raise ValueError(f"{self.kind}: summed keys {sorted(unknown)} are not reply arrays")
        if len(set(self.keys)) != len(self.keys):
            raise ValueError(f"{self.kind}: a reply key is listed twice")


@dataclass(frozen=True)
class Disclosure:
    """A table of the threat-model page: ``title``, the exchanges of the fits it describes, and
    what a client's final state holds when it goes to the server at the end of a run on Flower
    (``final_state``). Two declarations that share one ``Disclosure`` (the lasso and the ridge)
    share its table."""

    title: str
    exchanges: tuple[Exchange, ...]
    final_state: str
    note: str = ""


# --------------------------------------------------------------------------- command line
class CLIError(Exception):
    """Bad input to the command: printed as one line, exit status 2."""


@dataclass(frozen=True)
class Option:
    """A command-line option of one or more models.

    ``flag`` is its spelling (``"--family"``); ``kwargs`` go to argparse's ``add_argument``
    (``type``, ``choices``, ``action``; ``default`` only where the option is not an estimator
    parameter); ``param`` names the estimator parameter it sets, whose default is the
    estimator's own (the option defaults to ``None``, "not given"). ``help`` says what it
    does; the parser prefixes the models that take it."""

    flag: str
    help: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    param: str | None = None
    dest: str = ""

    def __post_init__(self) -> None:
        if not self.dest:
            object.__setattr__(self, "dest", self.kwargs.get("dest", self.flag.removeprefix("--").replace("-", "_")))

    @property
    def default(self) -> Any:
        """The value argparse gives when the option is not on the command line."""
        action = str(self.kwargs.get("action"))
        return {"store_true": False, "store_false": True}.get(action, self.kwargs.get("default"))


@dataclass(frozen=True)
class Command:
    """How ``fedstats fit --model NAME`` builds and reports a model.

    ``build(args)`` returns the estimator and the extra arguments of its ``fit``; an option
    the user did not give leaves the estimator's default. ``header(args, result, seconds)``
    is the line above the tables; ``notes(args, result)`` lines under it; ``extras(args,
    result, data, scaler)`` the model's own JSON fields; ``check(args)`` raises
    :class:`CLIError` for option values the model refuses (the options a model does not take
    are refused from ``options`` alone). ``explain(exc)`` turns an exception of the fit into
    a one-line message, or returns ``None``. ``target``: the model needs ``--target``;
    ``new_clients``: why it cannot predict a client outside the fit (``None``: it can);
    ``min_clients``: the fewest clients it fits; ``scale_inputs``: the command standardises
    the features with federated moments first (FGPR); ``standard_errors``: the summary's
    ``sd`` is a frequentist standard error, repeated as ``se`` in the JSON."""

    name: str
    help: str
    options: tuple[Option, ...]
    build: Callable[[argparse.Namespace], tuple[Any, dict[str, Any]]]
    header: Callable[[argparse.Namespace, Any, float], str]
    rounds: str = ""
    notes: Callable[[argparse.Namespace, Any], list[str]] | None = None
    extras: Callable[..., dict[str, Any]] | None = None
    check: Callable[[argparse.Namespace], None] | None = None
    explain: Callable[[BaseException], str | None] | None = None
    target: bool = True
    new_clients: str | None = None
    min_clients: int = 1
    scale_inputs: bool = False
    standard_errors: bool = False


# --------------------------------------------------------------------------- declaration
@dataclass(frozen=True)
class Expect:
    """What the tests that check every model alike expect of an example's result.

    ``posteriors``: whether it has a global and a client posterior; ``remedy``: what the error
    for a missing posterior names (an option or a model); ``new_client``: how it predicts a
    client outside the fit (``"population"``, ``"shared"`` coefficients, from the new client's
    own ``"data"``, ``"refused"``; mixtures: from the new client's rows); ``global_rows`` and
    ``client_rows``: whether ``summary()`` and ``client_summary()`` have rows; ``summary_sd``:
    whether ``summary()`` has sds (a posterior's, or an estimate's standard error);
    ``bands``: whether ``predict`` gives credible and predictive bands; ``discrete``: they are
    bands of 0/1 outcomes; ``mixture``: scikit-learn's meaning of ``predict`` (labels);
    ``unconverged``: the example stops before its convergence rule and must say so."""

    posteriors: tuple[bool, bool] = (False, False)
    remedy: str = ""
    new_client: str = "refused"
    global_rows: bool = True
    client_rows: bool = True
    summary_sd: bool | None = None
    bands: bool | None = None
    discrete: bool = False
    mixture: bool = False
    unconverged: bool = False

    def __post_init__(self) -> None:  # by default: sds and bands where the posteriors are
        if self.summary_sd is None:
            object.__setattr__(self, "summary_sd", self.posteriors[0])
        if self.bands is None:
            object.__setattr__(self, "bands", self.posteriors[1])


@dataclass(frozen=True)
class Example:
    """A small fit of the model, for the tests that check every model alike.

    ``params`` go to the estimator, ``fit`` to the fitting method ``method``; ``data`` names
    the data it takes: ``"regression"`` (the example sites with target y), ``"binary"`` (the
    same with y made 0/1), ``"features"`` (the sites' two features, no target), ``"survival"``
    (the sites' features, y made a tied time with an ``event`` column), ``"stream"``
    (two batches of an online stream, given to ``partial_fit`` in turn), or, for data of
    another shape, a ``"module:function"`` path: ``function(n_clients=..., seed=...)`` returns
    the federation (each test asks for the number of clients it needs; see :meth:`data_for`).
    ``expect``: what the every-model tests expect of its result (:class:`Expect`); ``long``:
    the parameters that make it a run of at least 12 rounds (the test that no fit draws a random
    stream twice runs it so, with 20 clients)."""

    name: str
    params: Mapping[str, Any] = field(default_factory=dict)
    fit: Mapping[str, Any] = field(default_factory=dict)
    data: str = "regression"
    method: str = "fit"
    expect: Expect = field(default_factory=Expect)
    long: Mapping[str, Any] = field(default_factory=dict)

    def data_for(self, builtin: Mapping[str, Callable[[], Any]], n_clients: int, seed: int = 0) -> Any:
        """The example's data in a test: the test's own source of a built-in name (``builtin``),
        else the federation of :attr:`data`'s function with ``n_clients`` clients.

        >>> ex = Example("x", data="fedstats.datasets.synthetic:hierarchical_logistic")
        >>> len(ex.data_for({}, n_clients=3).clients)
        3
        """
        if self.data in builtin:
            return builtin[self.data]()
        if ":" not in self.data:
            raise ValueError(
                f"example {self.name!r}: data {self.data!r} is neither a source of this test ({sorted(builtin)}) "
                "nor a 'module:function' path"
            )
        return load(self.data)(n_clients=n_clients, seed=seed)


@dataclass(frozen=True)
class Declaration:
    """Everything fedstats knows about one model, in one place.

    ``name`` is the model's key; ``estimator`` and ``result`` are ``"module:Class"`` paths
    (imported when used); ``summary`` one line on what it fits; ``disclosure`` the
    threat-model tables of its exchanges; ``command`` how ``fedstats fit`` runs it (``None``:
    Python only); ``reference`` the pooled fit it is tested against (a ``"module:callable"``
    path, possibly of a test-only package such as statsmodels); ``examples`` its small test
    fits; ``bad_parameter`` a ``(parameter, value)`` its constraints refuse."""

    name: str
    estimator: str
    result: str
    summary: str
    disclosure: tuple[Disclosure, ...] = ()
    command: Command | None = None
    reference: str | None = None
    examples: tuple[Example, ...] = ()
    bad_parameter: tuple[str, Any] | None = None

    @property
    def estimator_class(self) -> type:
        """The estimator class (imported now)."""
        cls: type = load(self.estimator)
        return cls

    @property
    def result_class(self) -> type:
        """The result class (imported now)."""
        cls: type = load(self.result)
        return cls
