"""The threat-model page's tables, from the registry's declarations: one table per
:class:`~fedstats.registry.spec.Disclosure` (the models that share one share its table), in the
registry's order. The docs build puts them where the page says ``<!-- threat_model_tables -->``
(the hook ``docs/_ext/threat_model.py``).

Example
-------
>>> from fedstats.registry.threat_page import threat_model_tables
>>> "### FederatedGLM" in threat_model_tables()
True
"""

from __future__ import annotations

from . import declarations
from .spec import Disclosure

MARKER = "<!-- threat_model_tables -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def disclosures() -> list[Disclosure]:
    """Every table of the page, once each, in the registry's order."""
    from .stats import STATS  # the statistics' functions: exchanges without a model

    out: list[Disclosure] = []
    for d in declarations().values():
        out += [t for t in d.disclosure if t not in out]
    return [*out, STATS]


def threat_model_tables() -> str:
    """The markdown of the threat-model page's model-by-model tables (one per table)."""
    out = []
    for m in disclosures():
        out.append(f"### {m.title}\n")
        if m.note:
            out.append(m.note + "\n")
        out.append(
            "| exchange | when | array | the server step gets | one client's copy reveals (without secure aggregation) |"
        )
        out.append("|---|---|---|---|---|")
        for e in m.exchanges:
            for i, a in enumerate(e.arrays):
                head = [f"{e.kind} (`{e.algorithm}`)", _cell(e.when)] if i == 0 else ["", ""]
                gets = "the sum over the clients" if a.key in e.summed else "each client's"
                cells = head + [f"`{a.key}`: {_cell(a.what)}", gets, _cell(a.reveals)]
                out.append("| " + " | ".join(cells) + " |")
        out.append(f"\nOn Flower, at the end of a run, the client's final state: {m.final_state}\n")
    return "\n".join(out)
