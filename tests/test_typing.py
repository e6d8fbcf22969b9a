"""The public API is typed: every function and public method that a package exports (its
``__all__``) annotates each of its parameters and its return value, so that mypy (run by
``make lint`` over the whole package) checks the calls into it."""

from __future__ import annotations

import importlib
import inspect

import pytest

PACKAGES = [
    "fedstats",
    "fedstats.data",
    "fedstats.results",
    "fedstats.estimator",
    "fedstats.inference",
    "fedstats.federation",
    "fedstats.linear",
    "fedstats.glm",
    "fedstats.gp",
    "fedstats.mixture",
    "fedstats.datasets",
    "fedstats.privacy",
]


def public_callables(package: str):
    module = importlib.import_module(package)
    for name in getattr(module, "__all__", []):
        obj = getattr(module, name)
        if inspect.isclass(obj):
            for attr, value in vars(obj).items():
                if attr.startswith("_") and attr != "__init__":
                    continue
                fn = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
                if inspect.isfunction(fn):
                    yield f"{package}.{name}.{attr}", fn
        elif inspect.isfunction(obj) or inspect.isfunction(getattr(obj, "__wrapped__", None)):
            yield f"{package}.{name}", obj


def unannotated(fn) -> list[str]:
    sig = inspect.signature(fn)
    missing = [
        p.name
        for n, p in sig.parameters.items()
        if n not in ("self", "cls") and p.annotation is inspect.Parameter.empty
    ]
    if sig.return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


@pytest.mark.parametrize("package", PACKAGES)
def test_public_api_is_annotated(package):
    gaps = {name: miss for name, fn in public_callables(package) if (miss := unannotated(fn))}
    assert not gaps, f"public callables without annotations (parameter or 'return'): {gaps}"
