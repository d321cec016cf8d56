"""Discovery: which files a knowledge base holds, and how awkward files are handled."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from crag.config import Settings
from crag.errors import KnowledgeBaseError
from crag.index import index_roots, open_index
from crag.index.discover import decode_text, discover, read_file_text


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def names(discovery, root: Path) -> list[str]:
    return sorted(os.path.relpath(f.path, root) for f in discovery.files)


def test_takes_text_files_and_skips_hidden_vendored_and_index_folders(tmp_path: Path) -> None:
    kb = tmp_path / "kb"
    write(kb / "guide.md", "# Guide\n")
    write(kb / "notes.txt", "notes\n")
    write(kb / "src" / "app.py", "print(1)\n")
    write(kb / "conf" / "settings.yaml", "a: 1\n")
    write(kb / "README", "readme\n")
    write(kb / "image.png", b"\x89PNG\r\n")
    write(kb / ".hidden.md", "secret\n")
    write(kb / ".git" / "config.md", "git\n")
    write(kb / "node_modules" / "pkg" / "readme.md", "vendored\n")
    write(kb / "env" / "pyvenv.cfg", "home = /usr\n")
    write(kb / "env" / "lib" / "site.py", "x = 1\n")
    write(kb / ".crag" / "gen-000001" / "x.md", "index\n")
    write(kb / "idx" / "gen-000001" / "note.md", "index internals\n")
    found = discover([kb], exclude=[kb / "idx"])
    assert names(found, kb) == ["README", "conf/settings.yaml", "guide.md", "notes.txt", "src/app.py"]


def test_a_single_file_can_be_a_root_and_a_missing_root_is_named(tmp_path: Path) -> None:
    one = write(tmp_path / "one.md", "# One\n")
    assert [f.path for f in discover([one]).files] == [str(one)]
    with pytest.raises(KnowledgeBaseError, match="does-not-exist"):
        discover([tmp_path / "does-not-exist"])


def test_a_root_inside_another_says_each_skipped_file_once(tmp_path: Path) -> None:
    """``crag index kb kb/sub`` walks kb/sub twice; a file named as a root is indexed whatever its name."""
    kb = tmp_path / "kb"
    write(kb / "sub" / "a.md", "# A\n")
    write(kb / "sub" / "data.xyz", "data\n")
    notes = write(kb / "notes", "plain notes\n")
    (kb / "sub" / "out.md").symlink_to(write(tmp_path / "outside.md", "secret\n"))
    found = discover([notes, kb, kb / "sub"])
    assert names(found, kb) == ["notes", "sub/a.md"]
    assert found.skipped_types == (".xyz",)  # not "notes" too: it is indexed
    assert [os.path.basename(p) for p, _ in found.warnings] == ["out.md"]


def test_symlinks_out_of_the_root_are_not_followed_and_inner_ones_count_once(tmp_path: Path) -> None:
    outside = write(tmp_path / "outside" / "secret.md", "top secret\n")
    kb = tmp_path / "kb"
    inner = write(kb / "docs" / "real.md", "# Real\n")
    (kb / "link-out.md").symlink_to(outside)
    (kb / "dir-out").symlink_to(outside.parent, target_is_directory=True)
    (kb / "link-in.md").symlink_to(inner)
    (kb / "loop").symlink_to(kb, target_is_directory=True)
    found = discover([kb])
    assert names(found, kb) == ["docs/real.md"]  # its own path, though the link sorts first
    reasons = {os.path.basename(p): why for p, why in found.warnings}
    assert "outside" in reasons["link-out.md"] and "outside" in reasons["dir-out"]
    assert all("secret" not in Path(f.path).read_text() for f in found.files)


def test_a_file_or_folder_reached_through_an_inner_link_is_indexed_under_its_own_path(tmp_path: Path) -> None:
    """A link inside the root to a file or folder of the root leaves it under its real path,
    whichever name sorts first; a link to what is left out where it lies does not bring it in."""
    kb = tmp_path / "kb"
    write(kb / "zz" / "guide.md", "# Guide\n")
    write(kb / "zz" / "deep" / "notes.md", "# Notes\n")
    write(kb / "private" / "only.md", "# Only through the link\n")
    write(kb / ".gitignore", "private/\n")
    (kb / "aa-guide.md").symlink_to(kb / "zz" / "guide.md")
    (kb / "aa-dir").symlink_to(kb / "zz", target_is_directory=True)
    (kb / "bb-only").symlink_to(kb / "private", target_is_directory=True)
    assert names(discover([kb]), kb) == ["zz/deep/notes.md", "zz/guide.md"]


def test_a_link_in_the_root_does_not_bring_in_what_is_left_out_where_it_lies(tmp_path: Path) -> None:
    """An ignore file, ``--exclude``, a hidden or vendored folder, or a name crag does not index
    leaves a file out under a link's name too: read_file refuses it there, and the link is no
    way round the rules (``env.md`` leading to ``.env`` indexed the secret)."""
    kb = tmp_path / "kb"
    write(kb / "ok.md", "# Ok\n")
    write(kb / ".env", "API_KEY=sk-live-123\n")
    write(kb / ".private" / "h.md", "# Hidden\n")
    write(kb / "node_modules" / "n.md", "# Vendored\n")
    write(kb / "server.key", "-----BEGIN KEY-----\n")
    write(kb / "secret" / "vault.md", "# Vault\n")
    write(kb / "drafts" / "plan.md", "# Plan\n")
    write(kb / "some" / "a.md", "# Left out by the rule of its real folder's parent\n")
    write(kb / "some" / "b.txt", "# Kept\n")
    write(kb / ".gitignore", "secret/\nsome/*.md\n")
    links = {"env.md": ".env", "hid.md": ".private/h.md", "nm.md": "node_modules/n.md", "key.md": "server.key",
             "vault.md": "secret/vault.md", "plan.md": "drafts/plan.md", "pub": "secret", "hidden": ".private",
             "vendored": "node_modules", "other": "some", "later": "drafts"}
    for name, target in links.items():
        (kb / name).symlink_to(kb / target, target_is_directory=(kb / target).is_dir())
    assert names(discover([kb], patterns=["drafts/"]), kb) == ["ok.md", "some/b.txt"]
    assert names(discover([kb]), kb) == ["drafts/plan.md", "ok.md", "some/b.txt"]


def test_non_utf8_text_is_decoded_with_a_fallback() -> None:
    assert decode_text("café".encode("cp1252")) == "café"
    assert decode_text(b"\xef\xbb\xbfbom\r\nline\rold-mac\n") == "bom\nline\nold-mac\n"
    assert decode_text(b"\x81\x8d\x8f\x90\x9d") == "\x81\x8d\x8f\x90\x9d"  # not cp1252: latin-1


def test_a_byte_order_mark_inside_a_file_is_dropped() -> None:
    """Files joined with ``cat`` carry each one's BOM into the middle: the invisible U+FEFF
    stuck to the next word and was quoted in answers and printed by ``search --json``."""
    assert decode_text(b"# A\n\nfirst\n\xef\xbb\xbf# B\n\nZanzibar\xef\xbb\xbf is an island.\n") == (
        "# A\n\nfirst\n# B\n\nZanzibar is an island.\n"
    )
    assert decode_text("a\n\ufeffb\n".encode("utf-16")) == "a\nb\n"


def test_invisible_breaks_inside_a_word_are_dropped_so_the_word_is_found(tmp_path: Path) -> None:
    """A soft hyphen, a zero-width space or a word joiner pasted from a web page splits nothing
    a reader sees ("wam\\u200bbler" shows as "wambler"), but it split the word for the full-text
    index: ``crag search wambler`` found no chunk. Dropped as a BOM inside the text is; the
    joiners that shape text (ZWJ in an emoji, ZWNJ in Persian) stay."""
    text = "# Misc\n\nThe wam\u200bbler service listens on port 7100.\nThe fri\u00adbble one on 7000.\n"
    text += "The tro\u2060ggle one on 7300.\nFamily \U0001f468\u200d\U0001f469 and \u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645.\n"
    assert decode_text(text.encode()) == (
        "# Misc\n\nThe wambler service listens on port 7100.\nThe fribble one on 7000.\n"
        "The troggle one on 7300.\nFamily \U0001f468\u200d\U0001f469 and \u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645.\n"
    )
    kb = tmp_path / "kb"
    write(kb / "misc.md", text)
    write(kb / "other.md", "# Other\n\nThe kilo service listens on port 8010.\n")
    settings = Settings(index_dir=str(tmp_path / "index"))
    index_roots(settings, [kb])
    with open_index(settings) as reader:
        for word in ("wambler", "fribble", "troggle"):
            hits = reader.search(word, 3)
            assert hits and hits[0].path.endswith("misc.md"), word
        for word in ("wam\u200bbler", "fri\u00adbble", "tro\u2060ggle"):  # a query pasted with them: found too
            hits = reader.search(word, 3)
            assert hits and hits[0].path.endswith("misc.md"), ascii(word)


def test_a_file_mixing_utf8_and_cp1252_lines_keeps_both_readable() -> None:
    """A log appended to by two tools: one UTF-8 line was enough to turn every other UTF-8
    line of the file into mojibake ("cafÃ©"), which no search for "café" found."""
    mixed = "# Menu\n\nThe café opens at 8.\n".encode() + "La crème brûlée coûte 5 €.\r\n".encode("cp1252")
    assert decode_text(mixed) == "# Menu\n\nThe café opens at 8.\nLa crème brûlée coûte 5 €.\n"
    assert decode_text("ok é\n".encode() + b"\x81\x8d\n") == "ok é\n\x81\x8d\n"  # not cp1252: latin-1


def test_utf16_text_with_its_byte_order_mark_is_text(tmp_path: Path) -> None:
    """What PowerShell's ``>`` writes: UTF-16 with a byte order mark, NUL bytes and all."""
    kb = tmp_path / "kb"
    write(kb / "le.txt", "Notes\r\n\r\nThe gateway listens on port 7311.\r\n".encode("utf-16"))
    write(kb / "be.md", b"\xfe\xff" + "# Keys\n\nThe zebra service rotates keys weekly.\n".encode("utf-16-be"))
    write(kb / "odd.txt", b"\xff\xfe" + "half".encode("utf-16-le") + b"\x00")  # odd length: not UTF-16
    assert decode_text((kb / "le.txt").read_bytes()) == "Notes\n\nThe gateway listens on port 7311.\n"
    assert read_file_text(kb / "be.md")[1] == "# Keys\n\nThe zebra service rotates keys weekly.\n"
    settings = Settings(index_dir=str(tmp_path / "index"))
    report = index_roots(settings, [kb])
    assert sorted(os.path.basename(p) for p in report.added) == ["be.md", "le.txt"]
    assert {os.path.basename(p): why for p, why in report.warnings} == {"odd.txt": "binary file"}
    with open_index(settings) as reader:
        hits = reader.search("gateway port 7311", 3)
        assert hits and hits[0].path.endswith("le.txt") and "port 7311" in hits[0].text


def test_binary_non_utf8_and_unreadable_files_while_indexing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    kb = tmp_path / "kb"
    write(kb / "good.md", "# Good\n\nThe retry policy allows three attempts.\n")
    write(kb / "latin.txt", "Le café est fermé le lundi.\n".encode("cp1252"))
    write(kb / "blob.txt", b"text\x00\x01\x02binary")
    unreadable = write(kb / "locked.md", "# Locked\n\nnobody can read this\n")
    import crag.index.reading as reading

    real_read = reading.read_bytes

    def read_bytes(path, *a, **k):
        if os.path.basename(path) == "locked.md":
            raise PermissionError(13, "Permission denied", str(path))
        return real_read(path, *a, **k)

    monkeypatch.setattr(reading, "read_bytes", read_bytes)
    settings = Settings(index_dir=str(tmp_path / "index"))
    report = index_roots(settings, [kb])
    assert sorted(os.path.basename(p) for p in report.added) == ["good.md", "latin.txt"]
    skipped = {os.path.basename(p): why for p, why in report.warnings}
    assert skipped == {"blob.txt": "binary file", "locked.md": "cannot read (Permission denied)"}
    with open_index(settings) as reader:
        hits = reader.search("café fermé lundi", 3)
        assert hits and hits[0].path.endswith("latin.txt")
        assert "café" in hits[0].text
        assert not any(h.path.endswith("blob.txt") for h in reader.search("binary text", 5))
    assert unreadable.exists()


_PIPE_RACE = """
import os, sys
import crag.index.build as build
from crag.config import Settings
from crag.index import index_roots

kb = sys.argv[1]
listed = build.discover

def discover_then_swap(*args, **kwargs):
    found = listed(*args, **kwargs)
    os.remove(os.path.join(kb, "b.md"))
    os.mkfifo(os.path.join(kb, "b.md"))  # no writer will ever open it
    return found

build.discover = discover_then_swap
report = index_roots(Settings(index_dir=sys.argv[2]), [kb])
print(sorted(os.path.basename(p) for p in report.added), report.warnings[0][1])
"""


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
def test_a_file_replaced_by_a_named_pipe_while_indexing_is_skipped_not_waited_for(tmp_path: Path) -> None:
    """A file listed, then replaced by a named pipe before it was read: the read waited for a
    writer that never came, and `crag index` hung."""
    import subprocess
    import sys

    kb = tmp_path / "kb"
    write(kb / "a.md", "# A\n\nThe first page.\n")
    write(kb / "b.md", "# B\n\nThe second page.\n")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    try:  # a guard against the hang, not a measure of time
        done = subprocess.run([sys.executable, "-c", _PIPE_RACE, str(kb), str(tmp_path / "index")],
                              capture_output=True, text=True, timeout=120, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail("indexing waited on a named pipe")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "['a.md'] cannot read (it is not a regular file)\n"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes are POSIX")
@pytest.mark.parametrize("kind", ["named pipe", "character device"])
def test_a_named_pipe_or_a_device_in_a_root_is_counted_and_listed_as_skipped(tmp_path: Path, kind: str) -> None:
    """A named pipe or a device named like a document (`pipe.md`, `dev.md`) was left out without a
    word, while a binary file beside it was listed: `crag index` says it skipped them and why,
    and never opens them (a pipe's read waits for a writer that never comes)."""
    import stat
    import subprocess
    import sys

    kb = tmp_path / "kb"
    write(kb / "a.md", "# A\n\nThe plain heron fishes.\n")
    write(kb / "bin.md", b"\x00")
    odd = kb / ("pipe.md" if kind == "named pipe" else "dev.md")
    if kind == "named pipe":
        os.mkfifo(odd)
    else:
        try:
            os.mknod(odd, 0o644 | stat.S_IFCHR, os.makedev(1, 3))  # what /dev/null is
        except (PermissionError, AttributeError):
            pytest.skip("making a device needs root")
    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KB_AGENT_", "OPENAI_"))}
    env.update(PYTHONPATH=str(root), KB_AGENT_INDEX_DIR=str(tmp_path / "index"))
    try:  # a guard against a hang, not a measure of time
        done = subprocess.run([sys.executable, "-m", "crag", "index", "kb"], cwd=tmp_path, capture_output=True,
                              text=True, timeout=120, env=env)
    except subprocess.TimeoutExpired:
        pytest.fail(f"indexing opened the {kind}")
    assert done.returncode == 0, done.stderr
    report = done.stdout.splitlines()
    assert report[1:3] == ["added:", "  kb/a.md"], done.stdout
    assert report[3:] == ["skipped 2 file(s):", f"  kb/{odd.name}: cannot read (it is not a regular file)",
                          "  kb/bin.md: binary file"], done.stdout


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
def test_utf16_text_with_its_byte_order_mark_is_text_not_binary(tmp_path: Path, encoding: str) -> None:
    """Windows PowerShell 5 writes `>` redirections as UTF-16 with a BOM: such a file was
    skipped as "binary file" by the index, read_file and grep_search."""

    bom = {"utf-16": b"", "utf-16-le": b"\xff\xfe", "utf-16-be": b"\xfe\xff"}[encoding]
    text = "# Notes\r\n\r\nThe café backup runs at 02:00 UTC.\r\n"
    write(tmp_path / "kb" / "notes.md", bom + text.encode(encoding))
    write(tmp_path / "kb" / "blob.md", b"\xff\xfe" + bytes(range(256)) * 8)  # a BOM, then no text
    settings = Settings(index_dir=str(tmp_path / "index"))
    report = index_roots(settings, [tmp_path / "kb"])
    assert [os.path.basename(p) for p in report.added] == ["notes.md"], report.warnings
    assert [(os.path.basename(p), why) for p, why in report.warnings] == [("blob.md", "binary file")]
    with open_index(settings) as reader:
        hit = reader.search("café backup", 1)[0]
        assert hit.path.endswith("notes.md") and hit.start_line == 1 and "The café backup runs at 02:00 UTC." in hit.text
    _read_and_grep_the_notes(settings, tmp_path / "kb")


@pytest.mark.parametrize("bom", [b"\xff\xfe", b""])
def test_utf16_text_holding_a_vertical_tab_is_text(tmp_path: Path, bom: bytes) -> None:
    """A UTF-16 file holding a vertical tab (Word's exports do) was skipped as "binary file",
    while the same text in UTF-8 was indexed."""
    write(tmp_path / "kb" / "notes.txt", bom + "The café backup\vruns at 02:00 UTC.\r\n".encode("utf-16-le"))
    settings = Settings(index_dir=str(tmp_path / "index"))
    report = index_roots(settings, [tmp_path / "kb"])
    assert [os.path.basename(p) for p in report.added] == ["notes.txt"], report.warnings


@pytest.mark.parametrize("encoding", ["utf-16-le", "utf-16-be"])
def test_utf16_text_without_a_byte_order_mark_is_text_not_binary(tmp_path: Path, encoding: str) -> None:
    """Some Windows tools write UTF-16 with no BOM: every other byte of its Latin text is NUL,
    and such a file was skipped as "binary file" by the index, read_file and grep_search."""

    text = "# Notes\r\n\r\nThe café backup runs at 02:00 UTC.\r\n"
    write(tmp_path / "kb" / "notes.md", text.encode(encoding))
    write(tmp_path / "kb" / "samples.txt", bytes(range(256)) * 8)  # 16-bit numbers, not text
    write(tmp_path / "kb" / "shorts.txt", b"".join(n.to_bytes(2, "little") for n in range(1, 4000)))
    settings = Settings(index_dir=str(tmp_path / "index"))
    report = index_roots(settings, [tmp_path / "kb"])
    assert [os.path.basename(p) for p in report.added] == ["notes.md"], report.warnings
    assert sorted(os.path.basename(p) for p, _ in report.warnings) == ["samples.txt", "shorts.txt"]
    with open_index(settings) as reader:
        hit = reader.search("café backup", 1)[0]
        assert hit.path.endswith("notes.md") and "The café backup runs at 02:00 UTC." in hit.text
    _read_and_grep_the_notes(settings, tmp_path / "kb")


def _read_and_grep_the_notes(settings: Settings, kb: Path) -> None:
    """``read_file`` and ``grep_search`` see notes.md's third line as the index does."""
    from crag.state import ToolCall
    from crag.tools import Toolbox

    box = Toolbox(settings, roots=[str(kb)])
    try:
        read = box.run(ToolCall("read_file", {"path": str(kb / "notes.md"), "start_line": 3}))
        assert [i.text for i in read.items] == ["The café backup runs at 02:00 UTC."]
        grep = box.run(ToolCall("grep_search", {"pattern": "backup runs"}))
        assert [i.start_line for i in grep.items] == [1] and "02:00" in grep.items[0].text
    finally:
        box.close()


def test_read_file_text_normalises_newlines(tmp_path: Path) -> None:
    p = write(tmp_path / "crlf.md", b"a\r\nb\r\n")
    data, text = read_file_text(p)
    assert data == b"a\r\nb\r\n" and text == "a\nb\n"


def test_the_index_folder_is_not_a_knowledge_base_root(tmp_path: Path) -> None:
    # `crag index .crag` added the index folder as a root of 0 files, shown by `crag roots`.
    index = tmp_path / ".crag"
    (index / "sub").mkdir(parents=True)
    for root in (index, index / "sub"):
        with pytest.raises(KnowledgeBaseError, match="is crag's index folder or inside it"):
            discover([str(root)], exclude=[str(index)])
    assert discover([str(tmp_path)], exclude=[str(index)]).files == ()  # a root holding it is fine
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text("# A\n\nText.\n", encoding="utf-8")
    for root in (tmp_path, tmp_path / "docs"):  # `--index .`: the project's documents share its folder
        assert [f.path for f in discover([str(root)], exclude=[str(tmp_path)]).files] == [str(tmp_path / "docs" / "a.md")]


def test_a_root_that_is_a_symbolic_link_loop_is_named_so(tmp_path: Path) -> None:
    # It said "does not exist", while `ls` shows it there.
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(KnowledgeBaseError, match="is a symbolic link that leads round in a loop"):
        discover([str(tmp_path / "a")])
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(KnowledgeBaseError, match="does not exist"):
        discover([str(tmp_path / "dangling")])
