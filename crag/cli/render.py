"""An answer printed for a person: on a terminal with ``rich`` installed (the ``color`` extra),
its Markdown rendered with colour; otherwise (piped, redirected, a locale that cannot write
every character, or without ``rich``) the
plain text, exactly as ``--json``'s ``answer`` holds it. The text is made terminal-safe and
redacted (``shown``) before either. The footer keeps one source per line, whatever the
terminal's width (the terminal wraps a long one, so it is copied whole).
"""

from __future__ import annotations

import re
from importlib.util import find_spec
from typing import TextIO

from ..sentences import split
from .common import dumb_terminal, isatty, shown, terminal_size, writes_any_text


def print_answer(out: TextIO, answer, show_usage: bool = True) -> None:
    """Print ``answer`` (an ``Answer``), without its usage block when ``show_usage`` is off."""
    text = answer.answer if show_usage else answer.without_usage
    # Under an ASCII locale the plain text too: rich's bullets and rules, written as escapes
    # ("\u2022", six columns where it counted one), broke its own wrapping.
    if not (isatty(out) and writes_any_text(out) and find_spec("rich") is not None):
        out.write(shown(text) + "\n")
        return
    from ..answer import answer_parts

    body, footer, usage = answer_parts(shown(answer.answer), answer.citations)
    _rich(out, body, footer, usage if show_usage else "")


_CODE_SPAN_OR_TAG = re.compile(r"(`+)(?:.+?)\1|<", re.S)


def literal_html(body: str) -> str:
    """``body`` with each ``<`` outside code escaped for the Markdown renderer, which drops
    what reads as HTML: "Set <PORT> to change the port" lost its ``<PORT>`` on a terminal."""
    out = []
    for piece in split(body):
        if piece.kind == "code":
            out.append(piece.text)
        else:
            out.append(_CODE_SPAN_OR_TAG.sub(lambda m: m.group(0) if m.group(1) else "\\<", piece.text))
    return "".join(out)


def _rich(out: TextIO, body: str, footer: str, usage: str) -> None:
    from rich.console import Console
    from rich.markdown import Markdown
    from rich.text import Text

    # rich takes a dumb terminal (TERM=dumb: Emacs' shell) for 80 columns whatever its width and
    # pads every line to them: on a narrower one each line wrapped into a blank row.
    width, height = terminal_size(out) if dumb_terminal() else (None, None)
    console = Console(file=out, highlight=False, emoji=False, width=width, height=height)
    console.print(Markdown(literal_html(body), hyperlinks=False))  # a link shows its address, as the plain text does
    if footer:  # a source a line, never broken by rich: the terminal wraps a long one, copied whole
        console.print()
        console.print(Text(footer, style="cyan"), soft_wrap=True)
    if usage:
        console.print()
        console.print(Markdown(usage), style="dim")
