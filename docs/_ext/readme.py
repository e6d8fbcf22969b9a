"""MkDocs hook: pages built from README.md's own sections when the site is built.

The README is the user documentation and the test suite runs its code blocks, so the site
includes its text rather than keeping copies that drift. A page asks for a part of it with a
comment on a line of its own:

    <!-- readme preamble -->                        the commands and paragraph before the first section
    <!-- readme section="Scaling out with Flower" level="1" -->
    <!-- readme section="Getting started" level="1" heading="no" -->

``section`` names a heading of the README exactly (its text after the ``#`` marks); the part
runs to the next heading of the same or a higher level. ``level`` is the heading level the
section's own heading takes on the page (its subsections move with it); ``heading="no"`` leaves
that heading out. A section the README does not have stops the build.

The included text is the README's, with one change markdown needs: a list that follows a
paragraph line directly (which GitHub renders as a list, Python-Markdown as part of the
paragraph) gets a blank line before it.
"""

from __future__ import annotations

import re
from pathlib import Path

from mkdocs.exceptions import PluginError

_DIRECTIVE = re.compile(r"^<!-- readme(?P<args>(?: [a-z]+(?:=\"[^\"]*\")?)*) -->[ \t]*$", re.MULTILINE)
_ARG = re.compile(r"([a-z]+)(?:=\"([^\"]*)\")?")
_HEADING = re.compile(r"^(?P<marks>#{1,6}) (?P<title>.+?)\s*$")
_LIST_ITEM = re.compile(r"^(?:[-*+]|\d+\.) ")


def _lines_outside_fences(lines: list[str]):
    """(index, line, inside a fenced code block) for every line."""
    fence = None
    for i, line in enumerate(lines):
        stripped = line.lstrip()
        if fence is None and stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
            yield i, line, True
        elif fence is not None:
            if stripped.startswith(fence):
                fence = None
            yield i, line, True
        else:
            yield i, line, False


def _headings(lines: list[str]) -> list[tuple[int, int, str]]:
    """(line index, level, title) of every heading outside code blocks."""
    out = []
    for i, line, fenced in _lines_outside_fences(lines):
        m = None if fenced else _HEADING.match(line)
        if m:
            out.append((i, len(m["marks"]), m["title"]))
    return out


def _shift(lines: list[str], by: int) -> list[str]:
    """Move every heading outside code blocks ``by`` levels up (negative: down)."""
    out = []
    for _, line, fenced in _lines_outside_fences(lines):
        m = None if fenced else _HEADING.match(line)
        if m:
            level = len(m["marks"]) - by
            if not 1 <= level <= 6:
                raise PluginError(f"README heading {line!r} cannot move to level {level}")
            line = "#" * level + " " + m["title"]
        out.append(line)
    return out


def _separate_lists(lines: list[str]) -> list[str]:
    """A blank line before a list that starts right after a paragraph line."""
    out: list[str] = []
    for _, line, fenced in _lines_outside_fences(lines):
        if (
            not fenced
            and _LIST_ITEM.match(line)
            and out
            and out[-1].strip()
            and not _LIST_ITEM.match(out[-1])
            and not out[-1].startswith((" ", "\t", "|", "#"))
        ):
            out.append("")
        out.append(line)
    return out


def _part(readme: list[str], args: dict[str, str]) -> list[str]:
    heads = _headings(readme)
    if "preamble" in args:
        start = heads[0][0] + 1 if heads and heads[0][1] == 1 else 0
        end = next((i for i, level, _ in heads if level > 1 and i >= start), len(readme))
        return readme[start:end]
    title = args.get("section")
    if not title:
        raise PluginError(f"readme directive without preamble or section: {args}")
    found = [(k, i, level) for k, (i, level, t) in enumerate(heads) if t == title]
    if len(found) != 1:
        raise PluginError(f"README.md has {len(found)} headings {title!r} (a page includes it)")
    k, start, level = found[0]
    end = next((i for i, lv, _ in heads[k + 1 :] if lv <= level), len(readme))
    part = readme[start:end]
    if "level" in args:
        part = _shift(part, level - int(args["level"]))
    if args.get("heading") == "no":
        part = part[1:]
    return part


def on_page_markdown(markdown: str, *, page, config, files) -> str:
    if "<!-- readme" not in markdown:
        return markdown
    readme = (Path(config.config_file_path).parent / "README.md").read_text(encoding="utf-8").split("\n")

    def include(m: re.Match) -> str:
        args = {k: v for k, v in _ARG.findall(m["args"])}
        part = _separate_lists(_part(readme, args))
        while part and not part[0].strip():
            part = part[1:]
        while part and not part[-1].strip():
            part = part[:-1]
        return "\n".join(part)

    return _DIRECTIVE.sub(include, markdown)
