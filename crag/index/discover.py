"""Which files make up a knowledge base, and how their text is read.

Owns the discovery rules shared by the indexer, ``grep_search`` and ``read_file``:

* a root is a directory (walked) or a single file; a root that does not exist is a
  ``KnowledgeBaseError`` naming it;
* only text-like files are taken (``TEXT_SUFFIXES`` and a few well-known names such as
  ``README`` or ``Makefile``), and documents a reader of ``crag.index.readers`` can read
  (PDF and DOCX when their extra is installed, HTML as text); every other file is counted by
  its suffix in ``Discovery.skipped_types``; paths that ``.cragignore`` / ``.ignore`` / ``.gitignore``
  files or ``--exclude`` patterns leave out are not entered (``crag.index.ignore``); hidden entries, ``.git``, ``.venv``, ``node_modules``,
  ``__pycache__``, Python virtual environments and the index directory itself are skipped;
* a symbolic link is followed only when its target lies inside the root (so a link can never
  pull outside files into the knowledge base), and each real file is taken once;
* binary files (a NUL byte in the first 8 KiB, unless the file is UTF-16 text, with its byte
  order mark or without one), oversized and unreadable files, and files
  or folders whose name is not valid UTF-8 (the index stores names as text) are skipped
  and counted as warnings, never raised; a root whose own path is not valid UTF-8 is a
  ``KnowledgeBaseError``;
* text is decoded as UTF-16 when it is UTF-16 (``utf16_codec``), else as UTF-8 (a BOM is
  dropped), else line by line as UTF-8, else cp1252, else latin-1 (a file may mix them), so
  undecodable bytes never crash indexing; line endings are normalised the way Python's text mode does
  (``\\r\\n`` and ``\\r`` become ``\\n``), NUL bytes past the first 8 KiB (a log padded
  after a crash) are dropped, which no store can hold as text and no line number depends
  on, and ``split_lines`` defines the 1-based line numbers every chunk, match and citation
  uses.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Iterable, Iterator, Sequence

from attrs import field, frozen

from ..errors import KnowledgeBaseError, UsageError
from ..safe_text import display_name, read_back_name
from .ignore import Ignores
from .labels import is_within, relative_label, relative_path  # re-exported here
from .reach import is_gone, not_a_file_or_folder, reachable, stat_error, unreachable  # re-exported here
from .readers import MAX_TEXT_BYTES, decode_text, reader_for, utf16_codec, utf16_text  # decode_text: re-exported here

__all__ = [
    "DOCUMENT_MAX_BYTES", "MAX_FILE_BYTES", "SKIP_DIRS", "TEXT_SUFFIXES", "UNLISTED", "BinaryFileError", "DiscoveredFile",
    "Discovery", "can_read", "decode_text", "discover", "excluded_reason", "held_root", "is_binary", "is_gone",
    "is_indexable_name", "is_text_name", "is_within", "missing_root", "normalize_root", "reachable",
    "read_bytes", "read_file_text", "relative_label", "relative_path", "size_limit", "split_lines", "stamp",
    "stat_error", "text_of", "unreachable"
]

UNLISTED = "cannot list folder"  # a folder's warning: its files are not seen, which is not their deletion

TEXT_SUFFIXES = frozenset(
    """
    .md .markdown .mdx .mdown .mkd .txt .text .rst .adoc .asciidoc .org .textile .tex
    .py .pyi .ipynb .toml .yaml .yml .json .jsonl .cfg .ini .conf .properties
    .sh .bash .zsh .fish .ps1 .bat
    .js .jsx .mjs .cjs .ts .tsx .vue .svelte .css .scss .less .html .htm .xml .svg
    .c .h .cc .cpp .cxx .hpp .hh .cs .java .kt .kts .scala .go .rs .rb .php .pl .pm .lua
    .r .jl .swift .m .mm .dart .ex .exs .erl .hs .ml .clj .sql .graphql .proto .tf .hcl
    .gradle .cmake .mk .dockerfile .csv .tsv .log .diff .patch
    """.split()
)
TEXT_NAMES = frozenset(
    """
    readme changelog changes history authors contributors license licence copying notice
    makefile dockerfile containerfile justfile procfile gemfile rakefile vagrantfile
    """.split()
)
SKIP_DIRS = frozenset({".git", ".hg", ".svn", ".venv", "venv", "node_modules", "__pycache__", "site-packages"})

MAX_FILE_BYTES = MAX_TEXT_BYTES  # larger "text" files are almost always data dumps or logs
DOCUMENT_MAX_BYTES = 128 * 1024 * 1024  # a PDF, DOCX or saved web page holds images and fonts besides its text


def size_limit(path: str | os.PathLike[str], max_bytes: int = MAX_FILE_BYTES) -> int:
    """The most bytes crag reads of the file ``path``: ``max_bytes``, or more for a document
    read through a reader (``DOCUMENT_MAX_BYTES``), whose text is a small part of its size."""
    reader = reader_for(os.path.basename(os.fspath(path)))
    return max(max_bytes, DOCUMENT_MAX_BYTES) if reader is not None else max_bytes
_SNIFF_BYTES = 8192


@frozen
class DiscoveredFile:
    """A file to index: its absolute path (as reached from the root), size and ``stamp``."""

    path: str
    root: str
    size: int
    mtime_ns: int


@frozen
class Discovery:
    """The files found under some roots, plus what was skipped and why."""

    files: tuple[DiscoveredFile, ...]
    warnings: tuple[tuple[str, str], ...] = field(factory=tuple)
    skipped_paths: tuple[str, ...] = ()  # each file left out for its type

    @property
    def skipped(self) -> int:
        return len(self.warnings)

    @property
    def skipped_types(self) -> tuple[str, ...]:
        """The suffix of each file left out for its type."""
        return tuple(_suffix(os.path.basename(p)) for p in self.skipped_paths)

    @property
    def unread(self) -> frozenset[str]:
        """The files left out only because their reader's extra is not installed."""
        return frozenset(p for p in self.skipped_paths if reader_for(os.path.basename(p)) is not None)


def normalize_root(root: str | os.PathLike[str], cwd: str | os.PathLike[str] | None = None) -> str:
    """The real path of a root: absolute, normalised, symbolic links resolved.

    One folder is one root however it is reached: indexed through a symbolic link and
    through its real path, it was two roots and every hit came back twice. An empty path is
    refused (``UsageError``) rather than taken as the working directory.
    """
    raw = os.fspath(root)
    if isinstance(raw, str) and (not raw.strip() or "\x00" in raw):
        raise UsageError("a knowledge-base path is empty" if not raw.strip() else "a knowledge-base path contains NUL")
    raw = os.path.expanduser(raw)
    if not os.path.isabs(raw):
        raw = os.path.join(os.fspath(cwd) if cwd is not None else os.getcwd(), raw)
    return os.path.realpath(raw)


def held_root(root: str, held: Sequence[str]) -> str:
    """``root``, or the root of ``held`` it names in the display form ``crag roots`` lists it
    in (``kb/tab\\there.md`` for a name holding a tab), read back."""
    if root in held:
        return root
    name = read_back_name(root)
    return name if name is not None and name in held else root


def missing_root(path: str, given: str | os.PathLike[str] | None = None) -> str:
    """Why a root is not there, as a message: it does not exist, it is a symbolic link that
    leads nowhere or round in a loop, or it cannot be reached (a folder on its way may not be
    entered). The path is named as crag shows paths: relative to the working folder when under it;
    a link the user ``given`` is named, not the path it leads to (which ``path`` resolves)."""
    if given is not None and os.path.islink(link := os.path.abspath(os.path.expanduser(os.fspath(given)))):
        path = link
    name = relative_label(path, typed=True)
    why = unreachable(path)
    if why is not None:
        return f"knowledge-base path {name} cannot be reached ({why})"
    if os.path.islink(path):
        try:
            os.stat(path)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return f"knowledge-base path {name} is a symbolic link that leads round in a loop"
        return f"knowledge-base path {name} is a symbolic link to {display_name(os.readlink(path))}, which does not exist"
    return f"knowledge-base path {name} does not exist"


def is_indexable_name(name: str) -> bool:
    """Whether crag indexes a file of this name: text, or a document whose reader is installed."""
    if is_text_name(name):
        return True
    reader = reader_for(name)
    return reader is not None and reader.available()


def _suffix(name: str) -> str:
    stem, dot, suffix = name.lower().rpartition(".")
    return "." + suffix if dot and stem else ""


def is_text_name(name: str) -> bool:
    """Whether a file name looks like text crag should index."""
    lower = name.lower()
    if lower in TEXT_NAMES:
        return True
    stem, dot, suffix = lower.rpartition(".")
    if not dot:
        return False
    if "." + suffix in TEXT_SUFFIXES:
        return True
    return stem in TEXT_NAMES  # README.old, LICENSE.txt handled above; Makefile.am etc.


def _is_virtualenv(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "pyvenv.cfg"))


def _skipped_dir(name: str, path: str) -> bool:
    """A folder discovery never enters (besides hidden ones and the index directory)."""
    return name in SKIP_DIRS or _is_virtualenv(path)


NOT_UTF8 = "its name is not valid UTF-8 (rename it to index it)"
NOT_REGULAR = "cannot read (it is not a regular file)"  # a named pipe, a device, a socket


def _utf8(name: str) -> bool:
    """Whether a name (as ``os.fsdecode`` gives it) is valid UTF-8 text, not undecodable bytes."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def excluded_reason(path: str, root: str, ignores: Ignores | None = None) -> str | None:
    """Why discovery would not index the file ``path`` under ``root`` (None: it would).

    Both are absolute and normalised, ``path`` inside ``root``. The same rules as the walk:
    no hidden or skipped folder on the way, a text or document file name (its reader's extra
    installed or not: one indexed earlier stays), not hidden. A root that is a file is indexed
    whatever its name. ``read_file`` serves only what this admits.
    """
    if path == root:
        return None
    rel = os.path.relpath(path, root).split(os.sep)
    folder = root
    ignores = ignores or Ignores(root)
    for part in rel[:-1]:
        folder = os.path.join(folder, part)
        if part.startswith(".") or not _utf8(part) or _skipped_dir(part, folder):
            return "it is inside a folder crag does not index"
        if ignores.ignored(folder, is_dir=True):
            return "it is inside a folder that an ignore file (.cragignore, .ignore, .gitignore) leaves out"
    name = rel[-1]
    if not _utf8(name):
        return NOT_UTF8
    if name.startswith("."):
        return "hidden files are not part of the knowledge base"
    if not is_text_name(name) and reader_for(name) is None:  # a reader's missing extra: text_of names it
        return "crag indexes text files only (Markdown, text, code and configuration by their suffix), PDF and DOCX"
    if ignores.ignored(path, is_dir=False):
        return "an ignore file (.cragignore, .ignore, .gitignore) leaves it out"
    return None


def _left_out_where_it_lies(real: str, root_abs: str, root_real: str, ignores: Ignores, is_dir: bool) -> bool:
    """Whether what a symbolic link in the root leads to (``real``, inside it) is left out where
    it lies: hidden, in a folder crag does not index, left out by an ignore file or ``--exclude``
    (a file: not a name crag indexes). A link is another name for it, not a way round those
    rules, as ``read_file``, which serves only the real path, refuses it."""
    there = os.path.join(root_abs, os.path.relpath(real, root_real))
    if not is_dir:
        return excluded_reason(there, root_abs, ignores) is not None
    folder = root_abs
    for part in os.path.relpath(there, root_abs).split(os.sep) if there != root_abs else ():
        folder = os.path.join(folder, part)
        if part.startswith(".") or _skipped_dir(part, folder) or ignores.ignored(folder, is_dir=True):
            return True
    return False


def discover(
    roots: Iterable[str | os.PathLike[str]],
    exclude: Sequence[str] = (),
    max_bytes: int = MAX_FILE_BYTES,
    check_binary: bool = False,
    patterns: Sequence[str] = (),
) -> Discovery:
    """Every indexable file under ``roots``, sorted by path, deduplicated by real path.

    ``exclude`` holds absolute directories never to enter (the index directory); ``patterns``
    are ``--exclude`` globs (gitignore syntax, relative to each root).
    ``check_binary`` sniffs each file for NUL bytes here; the indexer instead checks when it
    reads a file, so discovery stays a pure ``stat`` walk.
    Raises ``KnowledgeBaseError`` for a root that does not exist or cannot be listed.
    """
    excluded = {os.path.realpath(e) for e in exclude}
    found: dict[str, DiscoveredFile] = {}
    seen_real: set[str] = set()
    warnings: list[tuple[str, str]] = []
    skipped: list[str] = []
    for root in roots:
        root_abs = normalize_root(root)
        if not os.path.exists(root_abs):
            raise KnowledgeBaseError(missing_root(root_abs, root), root_abs)
        if not _utf8(root_abs):
            raise KnowledgeBaseError(
                f"knowledge-base path {relative_label(root_abs)} cannot be indexed: its name is not valid UTF-8",
                root_abs,
            )
        root_real = os.path.realpath(root_abs)
        try:
            st = os.stat(root_abs)
        except OSError as exc:
            raise KnowledgeBaseError(
                f"knowledge-base path {relative_label(root_abs)} cannot be read ({exc.strerror or exc})", root_abs
            ) from exc
        if stat.S_ISREG(st.st_mode):
            if root_real in seen_real:
                continue
            entry = _regular_file(root_abs, root_abs, st, max_bytes, warnings)
            if entry is not None and (not check_binary or _sniff_ok(entry.path, warnings)):
                seen_real.add(root_real)
                found[entry.path] = entry
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise KnowledgeBaseError(not_a_file_or_folder(root_abs, root), root_abs)
        if not os.access(root_abs, os.R_OK | os.X_OK):  # said as `crag index` says it (missing_root)
            raise KnowledgeBaseError(missing_root(root_abs) if unreachable(root_abs) else
                                     f"knowledge-base folder {relative_label(root_abs)} cannot be read (permission denied)",
                                     root_abs)
        walk = _walk(root_abs, root_real, excluded, max_bytes, warnings, seen_real, Ignores(root_abs, patterns), skipped)
        for entry in walk:
            if check_binary and reader_for(entry.path) is None and not _sniff_ok(entry.path, warnings):
                continue
            found.setdefault(entry.path, entry)
        if not any(is_within(p, root_abs) for p in found) and any(is_within(root_real, e) for e in excluded):
            # `crag index .crag`: a folder of crag's own files, not documents (an index kept in
            # the project folder, `--index .`, leaves the project's documents indexable)
            raise KnowledgeBaseError(
                f"knowledge-base path {relative_label(root_abs)} is crag's index folder or inside it: "
                "give the folders of your documents", root_abs)
    files = tuple(sorted(found.values(), key=lambda f: f.path))
    # A root inside another is walked twice, and a file named as a root is indexed whatever its
    # name: each skipped file is said once, and none that is indexed.
    skipped = [p for p in dict.fromkeys(skipped) if p not in found]
    return Discovery(files, tuple(dict.fromkeys(warnings)), tuple(skipped))


def _regular_file(
    path: str, root: str, st: os.stat_result, max_bytes: int, warnings: list[tuple[str, str]]
) -> DiscoveredFile | None:
    max_bytes = size_limit(path, max_bytes)
    if st.st_size > max_bytes:
        warnings.append((path, f"larger than {max_bytes // (1024 * 1024)} MiB"))
        return None
    return DiscoveredFile(path, root, st.st_size, stamp(st))


def stamp(st: os.stat_result) -> int:
    """When a file last changed, as ``stat`` tells: the later of its mtime and its ctime, which
    no one can set back, so an edit whose mtime was restored is seen (a ``chmod`` costs a read)."""
    return max(st.st_mtime_ns, st.st_ctime_ns)


_OWN_FILES = re.compile(r"^(?:CURRENT(?:\.tmp-\d+)?|LOCK|gen-\d{6,}|log\.sqlite(?:-wal|-shm|-journal)?)$")  # crag's, in an index folder


def _walk(
    root_abs: str,
    root_real: str,
    excluded: set[str],
    max_bytes: int,
    warnings: list[tuple[str, str]],
    seen_real: set[str],
    ignores: Ignores,
    skipped: list[str],
) -> Iterator[DiscoveredFile]:
    visited_dirs = {root_real}
    # (folder as reached from the root, its real path): the real path of an entry that is
    # not a symbolic link is then its folder's plus its name, with no realpath() walk.
    stack = [(root_abs, root_real, False)]  # and whether a symbolic link led to it
    # Entries reached through a symbolic link inside the root, taken once every folder reached
    # without one has been walked: a file is indexed under its own path, and a link counts only
    # when it leads to something not yet seen that is not left out where it lies. (path, real
    # path, stat; None for a folder)
    linked: list[tuple[str, str, os.stat_result | None]] = []
    while stack or linked:
        if not stack:
            for path, real, st in linked:
                if _left_out_where_it_lies(real, root_abs, root_real, ignores, is_dir=st is None):
                    continue
                if st is None:
                    if real not in visited_dirs:
                        visited_dirs.add(real)
                        stack.append((path, real, True))
                elif real not in seen_real:
                    item = _regular_file(path, root_abs, st, max_bytes, warnings)
                    if item is not None:
                        seen_real.add(real)
                        yield item
            linked = []
            stack.reverse()
            continue
        directory, directory_real, through = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            warnings.append((directory, f"{UNLISTED} ({exc.strerror or exc})"))
            continue
        subdirs = []
        own = directory_real in excluded  # an index kept in a folder of documents (`--index .`)
        for entry in entries:
            name = entry.name
            if name.startswith(".") or (own and _OWN_FILES.match(name)):
                continue
            path = entry.path
            if not _utf8(name):
                warnings.append((path, NOT_UTF8))
                continue
            try:
                link = entry.is_symlink()
                if link:
                    real = os.path.realpath(path)
                    if not is_within(real, root_real):
                        warnings.append((path, "symbolic link pointing outside the root"))
                        continue
                else:
                    real = os.path.join(directory_real, name)
                if entry.is_dir(follow_symlinks=True):
                    if real in visited_dirs or real in excluded or _skipped_dir(name, path):
                        continue
                    if ignores.ignored(path, is_dir=True):
                        continue
                    if link:
                        linked.append((path, real, None))
                        continue
                    if through and _left_out_where_it_lies(real, root_abs, root_real, ignores, is_dir=True):
                        continue
                    visited_dirs.add(real)
                    subdirs.append((path, real, through))
                    continue
                if ignores.ignored(path, is_dir=False):
                    continue
                if not entry.is_file(follow_symlinks=True):
                    # A named pipe, a device or a socket: never opened (a pipe's read blocks, a
                    # device's may never end), and said, as a file that cannot be read is. A
                    # link is left to what it leads to: its target in the root is said there,
                    # one outside it was said above, and a link to nothing stays unsaid.
                    if not link and is_indexable_name(name):
                        warnings.append((path, NOT_REGULAR))
                    continue
                if not is_indexable_name(name):
                    skipped.append(path)
                    continue
                st = entry.stat(follow_symlinks=True)
            except OSError as exc:
                warnings.append((path, f"cannot read ({exc.strerror or exc})"))
                continue
            if link:
                linked.append((path, real, st))
                continue
            if real in seen_real or (through and _left_out_where_it_lies(real, root_abs, root_real, ignores, False)):
                continue
            item = _regular_file(path, root_abs, st, max_bytes, warnings)
            if item is not None:
                seen_real.add(real)
                yield item
        stack.extend(reversed(subdirs))


def _sniff_ok(path: str, warnings: list[tuple[str, str]]) -> bool:
    try:
        with open(path, "rb") as f:
            head = f.read(_SNIFF_BYTES)
    except OSError as exc:
        warnings.append((path, f"cannot read ({exc.strerror or exc})"))
        return False
    if b"\x00" in head and utf16_codec(head) is None:  # UTF-16 is told from binary when read whole
        warnings.append((path, "binary file"))
        return False
    return True


def is_binary(data: bytes) -> bool:
    """A NUL byte in the first 8 KiB: not text, unless it is UTF-16 (``utf16_text``)."""
    return b"\x00" in data[:_SNIFF_BYTES] and utf16_text(data) is None


def can_read(path: str) -> bool:
    """Whether this process may open ``path`` for reading now (its permissions; no read).

    An update asks it of a file unchanged by size and mtime: ``chmod`` changes neither, and a
    file that can no longer be read leaves the index as any unreadable file does."""
    return os.access(path, os.R_OK)


def read_bytes(path: str | os.PathLike[str], max_bytes: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of a file; ``ValueError`` when it is larger than ``max_bytes`` (``size_limit``: more
    for a PDF or DOCX), ``OSError`` when unreadable."""
    max_bytes = size_limit(path, max_bytes)
    # Opened without waiting, and read only when a regular file: a file replaced since it was
    # listed by a named pipe (or a link to a device) would otherwise block the read for ever.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    with open(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "it is not a regular file", os.fspath(path))
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"larger than {max_bytes // (1024 * 1024)} MiB")
    return data


class BinaryFileError(ValueError):
    """The file holds NUL bytes: it is not text."""


def text_of(path: str, data: bytes) -> str:
    """The text crag indexes and cites for the file ``path`` holding ``data``: a document's text
    through its reader (``crag.index.readers``), anything else decoded as text.

    Raises ``BinaryFileError`` for a file that is neither, and ``ValueError`` when a reader
    cannot read it or is not installed (the message says what to install)."""
    reader = reader_for(os.path.basename(path))
    if reader is None:
        if is_binary(data):
            raise BinaryFileError("binary file")
        from .readers import refuse_lfs_pointer

        refuse_lfs_pointer(data)  # a CSV's pointer, in a clone made without Git LFS's files
        return decode_text(data)
    if not reader.available():
        from .readers import DISTRIBUTION

        raise ValueError(f"reading {reader.name} needs the extra: pip install '{DISTRIBUTION}[{reader.extra}]'")
    from .readers import cached_text

    return cached_text(path, reader, data)


def read_file_text(path: str | os.PathLike[str], max_bytes: int = MAX_FILE_BYTES) -> tuple[bytes, str]:
    """The raw bytes and decoded text of a file.

    Raises ``BinaryFileError`` for a file with a NUL byte in its first 8 KiB, ``OSError``
    when it cannot be read, and ``ValueError`` when it is larger than ``max_bytes``.
    """
    data = read_bytes(path, max_bytes)
    if is_binary(data):
        raise BinaryFileError("binary file")
    return data, decode_text(data)


def split_lines(text: str) -> list[str]:
    """The lines of normalised text; line N (1-based) is ``split_lines(text)[N - 1]``.

    A final newline does not start an extra empty line, so ``"a\\nb\\n"`` has two lines.
    """
    if not text:
        return []
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines
