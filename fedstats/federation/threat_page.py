"""The threat-model page's generated tables (:func:`threat_model_tables`, from the declarations
of :mod:`fedstats.federation.disclosure`), and their writer: ``python -m
fedstats.federation.threat_page docs/threat-model.md`` replaces the text between the page's
markers with them (a test checks the page is current)."""

from __future__ import annotations

from .disclosure import MODELS


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def threat_model_tables() -> str:
    """The markdown of the threat-model page's model-by-model tables (one per model)."""
    out = []
    for name, m in MODELS.items():
        out.append(f"### {name}\n")
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


BEGIN, END = "<!-- generated: threat_model_tables -->", "<!-- end generated -->"


def write_tables(page: str) -> None:
    """Replace the text between the markers ``BEGIN`` and ``END`` of the markdown file ``page``
    with :func:`threat_model_tables`."""
    with open(page, encoding="utf-8") as f:
        text = f.read()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{page} has no {BEGIN} ... {END} markers")
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    with open(page, "w", encoding="utf-8") as f:
        f.write(f"{head}{BEGIN}\n\n{threat_model_tables().strip()}\n\n{END}{tail}")


if __name__ == "__main__":  # python -m fedstats.federation.threat_page docs/threat-model.md
    import sys

    write_tables(sys.argv[1])
