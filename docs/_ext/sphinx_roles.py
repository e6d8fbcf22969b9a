"""Griffe extension: render the Sphinx roles of fedstats's docstrings as cross-references.

fedstats's docstrings are numpydoc with Sphinx roles (:class:`~fedstats.data.FederatedData`,
:meth:`fit`, :mod:`fedstats.results`), which mkdocstrings does not interpret. This extension
rewrites each role into inline code wrapped in an *optional* autorefs reference: it becomes a
link when the target is documented on the site and stays plain code otherwise (a private
module, another library), without a warning. Relative targets are resolved in the scope of
the object whose docstring holds them. It also reads napoleon's "Example" section header as
"Examples" (the only spelling griffe's numpy parser knows) and drops reST's "::" before a
literal block. Only the rendered text changes, never the source.
"""

from __future__ import annotations

import html
import re
from typing import Any

import griffe

# :role:`target`, :role:`~target`, :role:`title <target>`; also :py:role:`...`
_ROLE = re.compile(r":(?:py:)?(?P<role>class|func|meth|mod|attr|data|exc|obj|const):`(?P<body>[^`]+)`")
_TITLED = re.compile(r"^(?P<title>.*?)\s*<(?P<target>[^<>]+)>$", re.DOTALL)
# a numpydoc item line "name : type" (parameters, returns, ...)
_ITEM = re.compile(r"^(?P<name>[ \t]*[^\s:][^:]*? : )(?P<type>.*)$")
# reST's "text::" before an indented literal block: markdown shows the block as code already
_LITERAL = re.compile(r"(?<=\S)::(?=\n[ \t]*\n)")
# napoleon's "Example" header, which griffe's numpy parser knows only as "Examples"
_EXAMPLE = re.compile(r"^(?P<indent>[ \t]*)Example\n(?P=indent)-{7}[ \t]*$", re.MULTILINE)


def _identifier(obj: griffe.Object, target: str) -> str:
    """The full path of ``target`` as seen from ``obj`` (the target itself if it cannot be resolved)."""
    target = target.lstrip(".")
    if target.startswith("fedstats."):
        return target
    head, _, rest = target.partition(".")
    for scope in (obj, obj.parent):
        if scope is None:
            continue
        try:
            resolved = scope.resolve(head)
        except Exception:  # griffe raises several kinds here; an unresolved name stays as written
            continue
        return f"{resolved}.{rest}" if rest else resolved
    return target


def _title(body: str) -> tuple[str, str]:
    """(title, target) of a role's body, as Sphinx shows it."""
    titled = _TITLED.match(body)
    if titled:
        return titled["title"], titled["target"].strip()
    target = body.lstrip("~")
    return (target.rsplit(".", 1)[-1] if body.startswith("~") else target), target


def _replace(obj: griffe.Object, match: re.Match) -> str:
    title, target = _title(match["body"].strip())
    identifier = html.escape(_identifier(obj, target), quote=True)
    return f'<autoref identifier="{identifier}" optional><code>{html.escape(title)}</code></autoref>'


def _roles(obj: griffe.Object, line: str) -> str:
    item = _ITEM.match(line)
    if item:  # the type of a numpydoc item is shown as written (escaped): keep its roles' titles only
        return item["name"] + _ROLE.sub(lambda m: _title(m["body"].strip())[0], item["type"])
    return _ROLE.sub(lambda m: _replace(obj, m), line)


class SphinxRoles(griffe.Extension):
    """Sphinx roles into optional cross-references, "Example" headers into "Examples", "::" into ":"."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.is_alias or obj.docstring is None:
            return
        value = _EXAMPLE.sub(lambda m: f"{m['indent']}Examples\n{m['indent']}--------", obj.docstring.value)
        value = _LITERAL.sub(":", value)
        if ":" in value and "`" in value:
            value = "\n".join(_roles(obj, line) for line in value.split("\n"))
        obj.docstring.value = value
