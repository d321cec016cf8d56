"""A file edited after it was indexed: a citation never points at text the file no longer holds.

``ask`` without ``--kb`` searches the index as it stands; the user may have edited a file
since. ``vector_search`` hands back the chunk the index holds, so its lines are checked
against the file on disk: text that moved is cited where it is now, text that is gone is
not evidence (the file no longer says it), and both are audited ``source_changed``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from crag.config import Settings
from crag.index.current import current_lines, place_now
from crag.state import ToolCall
from crag.tools import Toolbox
from tests.fakes import clean_env, cli

ORIGINAL = "# Gateway\n\nThe walrus gateway listens on port 7001 by default.\n\nThe walrus admin panel is at /admin.\n"
MOVED = ("# Gateway\n\nA new first paragraph about nothing.\n\nAnother new paragraph.\n\n"
         "The walrus gateway listens on port 7001 by default.\n\nThe walrus admin panel is at /admin.\n")
CHANGED = "# Gateway\n\nThe walrus gateway listens on port 7002 by default.\n\nThe walrus admin panel is at /admin.\n"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(text.encode("utf-8"))
    return path


@pytest.fixture
def kb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``docs/gateway.md`` indexed as ORIGINAL; the working directory is ``tmp_path``."""
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "index"))
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    write(tmp_path / "docs" / "gateway.md", ORIGINAL)
    assert cli("index", "docs")[0] == 0
    return tmp_path / "docs"


def lines_of(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").split("\n")


def search(kb: Path, query: str):
    box = Toolbox(Settings(index_dir=str(kb.parent / "index")), cwd=kb.parent)
    try:
        return box.run(ToolCall("vector_search", {"query": query, "top_k": 5}))
    finally:
        box.close()


def test_an_unchanged_file_is_cited_as_indexed_and_nothing_is_audited(kb: Path) -> None:
    result = search(kb, "walrus gateway port")
    assert result.items and not result.audit
    for item in result.items:
        assert "\n".join(lines_of(kb / "gateway.md")[item.start_line - 1 : item.end_line]) == item.text


def test_text_that_moved_is_cited_where_it_is_now(kb: Path) -> None:
    write(kb / "gateway.md", MOVED)  # two paragraphs inserted above; not re-indexed
    result = search(kb, "walrus gateway port")
    assert result.items
    now = lines_of(kb / "gateway.md")
    for item in result.items:
        assert "\n".join(now[item.start_line - 1 : item.end_line]) == item.text
    changed = [e for e in result.audit if e.event == "source_changed"]
    assert changed and changed[0].fields["source"] == "docs/gateway.md"


def test_a_changed_passage_is_read_as_the_file_holds_it_now(kb: Path) -> None:
    write(kb / "gateway.md", CHANGED)  # 7001 became 7002; not re-indexed
    result = search(kb, "walrus gateway port")
    assert result.items and not any("7001" in item.text for item in result.items)
    top = result.items[0]
    assert "7002" in top.text
    assert "\n".join(lines_of(kb / "gateway.md")[top.start_line - 1 : top.end_line]) == top.text
    assert [e.fields["line"] for e in result.audit if e.event == "source_changed"] == [top.start_line]


def test_text_the_file_no_longer_holds_is_not_evidence(kb: Path) -> None:
    write(kb / "gateway.md", "# Gateway\n\nRetired: see the new proxy.\n")  # rewritten, not re-indexed
    result = search(kb, "walrus gateway port")
    assert not any("walrus" in item.text for item in result.items)
    gone = [e.fields for e in result.audit if e.event == "source_changed"]
    assert gone and gone[0]["source"] == "docs/gateway.md" and gone[0]["line"] is None
    assert gone[0]["indexed"] == "L1-L5" and "crag index" in gone[0]["hint"]


def test_a_file_that_cannot_be_read_now_is_cited_as_the_index_holds_it(kb: Path) -> None:
    (kb / "gateway.md").unlink()  # the store may be shared with a machine that has the file
    result = search(kb, "walrus gateway port")
    assert result.items and result.items[0].start_line == 1 and not result.audit


def test_a_file_now_a_link_out_of_the_roots_is_not_read_through_it(kb: Path, tmp_path: Path) -> None:
    """``crag index`` never follows a link out of a root; nor does the check of an edited file."""
    outside = write(tmp_path / "elsewhere" / "private.md", MOVED.replace("Another new", "TOKEN=s3cr3t. Another new"))
    (kb / "gateway.md").unlink()
    (kb / "gateway.md").symlink_to(outside)
    result = search(kb, "walrus gateway port")
    assert result.items and not any("s3cr3t" in item.text for item in result.items)
    assert result.items[0].start_line == 1 and not result.audit


def test_a_file_an_ignore_file_now_leaves_out_is_not_evidence(kb: Path) -> None:
    """As ``read_file`` and ``grep_search`` refuse it: ignored since indexing, it may hold a secret."""
    write(kb / ".cragignore", "gateway.md\n")  # not re-indexed
    result = search(kb, "walrus gateway port")
    assert not result.items
    gone = [e.fields for e in result.audit if e.event == "source_changed"]
    assert gone and gone[0]["line"] is None and "ignore file" in gone[0]["hint"]


def test_a_file_indexed_through_a_link_inside_the_root_is_read_through_it(tmp_path: Path, monkeypatch) -> None:
    """A file indexed and then replaced by a link inside the root (to where it moved, and was
    edited) is read through the link: the text moved, and the hit was cited at its indexed
    lines, which no longer show it."""
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "index"))
    monkeypatch.setenv("KB_AGENT_LLM", "offline")
    write(tmp_path / "docs" / "gateway.md", ORIGINAL)
    assert cli("index", "docs")[0] == 0
    target = write(tmp_path / "docs" / "drafts" / "gateway.md", MOVED)
    (tmp_path / "docs" / "gateway.md").unlink()
    (tmp_path / "docs" / "gateway.md").symlink_to(target)
    result = search(tmp_path / "docs", "walrus gateway port")
    assert result.items and result.items[0].source == "docs/gateway.md"
    now = lines_of(target)
    for item in result.items:
        assert "\n".join(now[item.start_line - 1 : item.end_line]) == item.text
    assert [e.fields["source"] for e in result.audit if e.event == "source_changed"] == ["docs/gateway.md"]


def test_ask_cites_the_line_that_holds_the_quoted_text_after_an_edit(kb: Path) -> None:
    write(kb / "gateway.md", MOVED)
    code, out, err = cli("ask", "--json", "Which port does the walrus gateway listen on?")
    assert code == 0, err
    result = json.loads(out)
    assert result["citations"]
    now = lines_of(kb / "gateway.md")
    for citation in result["citations"]:
        assert "walrus" in now[citation["line"] - 1], citation
    assert "7001" in now[result["citations"][0]["line"] - 1]
    assert any(e["event"] == "source_changed" for e in result["audit"])


def test_ask_does_not_quote_what_an_edited_file_no_longer_says(kb: Path) -> None:
    write(kb / "gateway.md", CHANGED)
    code, out, err = cli("ask", "--json", "Which port does the walrus gateway listen on?")
    assert code == 0, err
    result = json.loads(out)
    assert "7001" not in result["answer"] and "port 7002" in result["body"]
    now = lines_of(kb / "gateway.md")
    assert "7002" in now[result["citations"][0]["line"] - 1]


def test_a_stray_match_far_away_does_not_stretch_the_place() -> None:
    chunk = "## Build\n\n```\nmake all\n```"
    lines = ["```", "other", "```"] + ["filler"] * 50 + ["## Build", "", "New line.", "```", "make all", "```"]
    start, end, text = place_now(chunk, 1, 5, lines)
    assert (start, end) == (54, 59) and text == "\n".join(lines[53:59])


def test_a_piece_of_a_long_line_is_found_on_the_line_that_holds_it_now() -> None:
    lines = ["new first line", "x" * 10 + "the piece" + "y" * 10]
    assert place_now("the piece", 1, 1, lines) == (2, 2, "the piece")
    assert place_now("the piece", 1, 1, ["nothing here"]) is None


def test_a_pdf_is_cited_as_indexed_without_extracting_its_text_again(tmp_path: Path) -> None:
    """A PDF's text takes seconds to extract, on every ask: it is not read for this check."""
    pytest.importorskip("pypdf", reason="the pdf extra (make install has it)")
    from tests.test_readers import make_pdf

    make_pdf(tmp_path / "guide.pdf", [["The narwhal service listens on port 6060."]])
    assert current_lines(str(tmp_path / "guide.pdf"), [str(tmp_path)]) is None
    (tmp_path / "notes.md").write_text("one\ntwo\n")
    assert current_lines(str(tmp_path / "notes.md"), [str(tmp_path)]) == ["one", "two"]


def test_a_file_an_older_crag_indexed_with_its_invisible_characters_is_still_evidence(
    kb: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An older crag kept a zero-width space or a soft hyphen in a text file's indexed text;
    crag now reads the file without them, and ``crag index`` leaves it alone (its bytes are the
    same). Compared with the file as read now, its chunk was "no longer there": no evidence,
    audited source_changed, until the file itself changed."""
    import crag.index.decoding as decoding

    write(kb / "gateway.md", ORIGINAL.replace("walrus gateway", "wal\u200brus gate\u00adway"))
    with monkeypatch.context() as older:
        older.setattr(decoding, "without_invisible", lambda text: text)  # as an older crag read it
        assert cli("index", "docs")[0] == 0
    result = search(kb, "walrus admin panel")
    assert [item.start_line for item in result.items] == [1] and not result.audit, result.audit
    assert "The walrus gateway listens on port 7001" in result.items[0].text
