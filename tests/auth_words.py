"""Lines of documentation that hold "basic", "bearer" or "token" before a word: a document's
own text, which crag must print exactly as written (issue 26, finding 1).

From the shared documentation corpora when they are beside the repository, else a few lines
of the same kinds ("CPU Basic hardware", "## Token Policy", an example header).
"""

from __future__ import annotations

import re
from pathlib import Path

CORPORA = Path(__file__).resolve().parents[2] / "shared" / "corpora"
AUTH_WORD = re.compile(r"(?i)\b(basic|bearer|token)(\s+|=)[A-Za-z0-9._~+/=\-]{6,}")
FALLBACK = [
    "| CPU Basic hardware | 2 vCPU | 16 GB |",
    "## Token Policy",
    "If the token contains `foobar`, the request is refused.",
    "Send it as `Authorization: Bearer hf_xxxxxxxx` in the request headers.",
    "Use token=abcdefgh in the query string of the example.",
]


def auth_word_lines() -> list[str]:
    """Every distinct such line of the corpora (stripped), or the fallback lines."""
    found: dict[str, None] = {}
    if CORPORA.is_dir():
        for path in sorted(CORPORA.rglob("*")):
            if path.is_file() and path.suffix in {".md", ".txt", ".mdx"}:
                for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
                    if AUTH_WORD.search(line) and line.strip():
                        found[line.strip()] = None
    return list(found) or list(FALLBACK)


def auth_word_document() -> str:
    """The lines as one Markdown document, a paragraph each."""
    return "# Auth words\n\n" + "\n\n".join(auth_word_lines()) + "\n"
