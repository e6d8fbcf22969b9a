"""Writes the threat-model page's generated tables: ``python -m fedstats.federation.threat_page
docs/threat-model.md`` replaces the text between the page's markers with
:func:`fedstats.federation.disclosure.threat_model_tables` (a test checks the page is current)."""

from __future__ import annotations

from .disclosure import threat_model_tables

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
