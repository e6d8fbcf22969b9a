"""MkDocs hook: the threat-model page's model-by-model tables, generated when the site is built.

A page asks for them with ``<!-- threat_model_tables -->`` on a line of its own; the tables are
:func:`fedstats.registry.threat_page.threat_model_tables`, read from the models' declarations,
so the page cannot drift from the code and a new model's tables appear without editing it.
"""

from __future__ import annotations


def on_page_markdown(markdown: str, *, page, config, files) -> str:
    from fedstats.registry.threat_page import MARKER, threat_model_tables

    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, threat_model_tables().strip())
