"""``read_file(path, start_line=None, end_line=None)``: lines of one knowledge-base file.

The path is relative to a root (or to the working directory) or absolute, and must lead to
a file inside the roots (``crag.tools.paths``): ``..``, outside absolute paths, links out
of a root, hidden files and binary files are refused with a ``ToolError``. At most
``MAX_LINES`` lines are returned: from ``start_line`` (default 1) to ``end_line``
(default: as many as allowed). Lines are numbered as everywhere in crag
(``crag.index.discover.split_lines``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ..errors import ToolError
from ..index.discover import MAX_FILE_BYTES, decode_text, is_binary, read_bytes, split_lines
from ..state import EvidenceItem
from .args import check_known, opt_int, req_str
from .paths import resolve_in_roots

if TYPE_CHECKING:
    from . import Toolbox

NAME = "read_file"
MAX_LINES = 200


def run(box: Toolbox, args: Mapping[str, Any]) -> list[EvidenceItem]:
    check_known(NAME, args, ("path", "start_line", "end_line"))
    requested = req_str(NAME, args, "path", max_len=4096)
    start = opt_int(NAME, args, "start_line", None, 1, 10**9)
    end = opt_int(NAME, args, "end_line", None, 1, 10**9)
    real = resolve_in_roots(NAME, requested, box.file_roots(), str(box.cwd), excluded=[box.index_dir])
    try:
        data = read_bytes(real, MAX_FILE_BYTES)
    except (OSError, ValueError) as exc:
        raise ToolError(NAME, f"cannot read {requested} ({getattr(exc, 'strerror', None) or exc})") from exc
    if is_binary(data):
        raise ToolError(NAME, f"{requested} is a binary file")
    lines = split_lines(decode_text(data))
    if not lines:
        raise ToolError(NAME, f"{requested} is empty")
    first = start or 1
    if first > len(lines):
        raise ToolError(NAME, f"{requested} has {len(lines)} lines; start_line {first} is past the end")
    last = end if end is not None else first + MAX_LINES - 1
    if last < first:
        raise ToolError(NAME, f"end_line {last} is before start_line {first}")
    last = min(last, len(lines), first + MAX_LINES - 1)
    return [
        EvidenceItem(
            tool=NAME,
            source=box.label(real),
            text="\n".join(lines[first - 1 : last]),
            start_line=first,
            end_line=last,
        )
    ]
