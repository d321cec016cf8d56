"""The local tools through the Toolbox port: vector_search, grep_search, read_file."""

from __future__ import annotations

import functools
import os
import re
import unicodedata
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crag.config import Settings
from crag.errors import IndexStoreError, ToolError
from crag.index import ensure_indexed, index_roots
from crag.ports import Toolbox as ToolboxPort
from crag.safe_text import display_name
from crag.state import ToolCall
from crag.tools import Toolbox


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


SETUP = "\n".join(
    [
        "# Setup",
        "",
        "Install the package with pip.",
        "",
        "## Retries",
        "",
        "The client retries failed uploads three times.",
        "Each retry waits twice as long as the one before.",
        "",
        "## Ports",
        "",
        "The server listens on port 8080 by default.",
        "",
    ]
)


@pytest.fixture
def env(tmp_path: Path):
    kb = tmp_path / "work" / "kb"
    write(kb / "setup.md", SETUP)
    write(kb / "notes" / "faq.txt", "Q: Where are logs?\nA: In /var/log/app.\nQ: Retry limit?\nA: Three.\n")
    write(kb / "code" / "client.py", "RETRIES = 3\n\n\ndef upload():\n    return RETRIES\n")
    write(kb / ".env", "SECRET=hunter2\n")
    write(tmp_path / "outside" / "secret.md", "# Secret\n\nthe launch code is 0000\n")
    cfg = Settings(index_dir=str(tmp_path / "work" / ".crag"))
    ensure_indexed(cfg, [kb])
    box = Toolbox(cfg, roots=[kb], cwd=tmp_path / "work")
    yield box, kb, tmp_path
    box.close()


def run(box: Toolbox, tool: str, **args):
    return list(box.run(ToolCall(tool, args)))  # grep_search returns a ToolResult (items + audit)


def test_it_is_a_toolbox_with_the_tools_in_order(tmp_path: Path) -> None:
    base = Settings(index_dir=str(tmp_path / "i"))
    assert isinstance(Toolbox(base), ToolboxPort)
    assert Toolbox(base).available() == ("vector_search", "grep_search", "read_file")
    full = Settings(
        index_dir=str(tmp_path / "i"),
        jira_base_url="https://jira.example.com",
        confluence_base_url="https://wiki.example.com",
        web_fetch=True,
    )
    assert Toolbox(full).available() == (
        "vector_search", "grep_search", "read_file", "jira_fetch", "confluence_fetch", "web_fetch",
    )
    assert Toolbox(Settings(index_dir="x", web_fetch=True)).available()[-1] == "web_fetch"


def test_unknown_tools_disabled_tools_and_bad_arguments_are_tool_errors(env) -> None:
    box, _, _ = env
    with pytest.raises(ToolError, match="unknown tool"):
        run(box, "rm_rf", path="/")
    with pytest.raises(ToolError, match=r"web_fetch is not enabled.*KB_AGENT_WEB_FETCH=on"):
        run(box, "web_fetch", url="https://example.com")
    with pytest.raises(ToolError, match="unknown argument"):
        run(box, "vector_search", query="x", limit=3)
    with pytest.raises(ToolError, match="'query' must be a non-empty string"):
        run(box, "vector_search", query="  ")
    with pytest.raises(ToolError, match="'top_k' must be between 1 and 50"):
        run(box, "vector_search", query="x", top_k=0)
    with pytest.raises(ToolError, match="'top_k' must be an integer"):
        run(box, "vector_search", query="x", top_k=True)
    with pytest.raises(ToolError, match="'start_line' must be an integer"):
        run(box, "read_file", path="setup.md", start_line="two")
    # a refused value is shown cut short: MCP hands 1e300 on as its 301-digit integer
    with pytest.raises(ToolError) as huge:
        run(box, "read_file", path="setup.md", start_line=10**300)
    assert str(huge.value).endswith("got 1000000000000000000000000000000000000... (301 characters)")
    with pytest.raises(ToolError, match=r"got 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\.\.\. \(10,002 characters\)$"):
        run(box, "read_file", path="setup.md", start_line="x" * 10_000)
    with pytest.raises(ToolError, match=r"got an integer of thousands of digits$"):
        run(box, "read_file", path="setup.md", start_line=10**5000)


def test_vector_search_returns_one_item_per_chunk_with_lines_and_cosine(env) -> None:
    box, _kb, _ = env
    items = run(box, "vector_search", query="how many times are failed uploads retried", top_k="2")
    assert 1 <= len(items) <= 2
    top = items[0]
    assert top.tool == "vector_search" and top.source == "kb/setup.md"
    lines = SETUP.split("\n")
    assert top.text == "\n".join(lines[top.start_line - 1 : top.end_line])
    assert "three times" in top.text
    assert 0.0 <= top.score <= 1.0 and top.title.startswith("Setup")
    assert len({i.key for i in items}) == len(items)


def test_vector_search_stays_inside_the_toolbox_roots(env, tmp_path: Path) -> None:
    box, kb, base = env
    other = write(base / "other" / "ports.md", "# Ports\n\nThe other service listens on port 9090.\n").parent
    ensure_indexed(box.settings, [other])
    scoped = run(box, "vector_search", query="which port does the service listen on", top_k=5)
    assert scoped and all(i.source.startswith("kb/") for i in scoped)
    everything = Toolbox(box.settings, cwd=base / "work")  # roots=None: all the index holds
    sources = {i.source for i in run(everything, "vector_search", query="service listens on port 9090", top_k=5)}
    assert str(other / "ports.md") in sources  # outside cwd: absolute
    assert set(everything.file_roots()) == {str(kb), str(other)}


def test_the_toolbox_sees_a_re_index_without_being_rebuilt(env) -> None:
    box, kb, _ = env
    assert not any("gzip" in i.text for i in run(box, "vector_search", query="gzip compression", top_k=5))
    write(kb / "compression.md", "# Compression\n\nResponses are compressed with gzip when large.\n")
    ensure_indexed(box.settings, [kb])
    items = run(box, "vector_search", query="gzip compression", top_k=5)
    assert items[0].source == "kb/compression.md"


def test_a_long_running_toolbox_opens_the_index_once(env) -> None:
    """The library, chat and the MCP server keep one toolbox: searches reuse its retriever."""
    box, kb, _ = env
    run(box, "vector_search", query="retries")
    first = box.retriever()
    for q in ("port 8080", "logs", "retries"):
        run(box, "vector_search", query=q)
    assert box.retriever() is first
    write(kb / "more.md", "# More\n\nAnother page.\n")
    ensure_indexed(box.settings, [kb])
    assert box.retriever() is not first  # a re-index is seen, once
    assert box.retriever() is box.retriever()


def test_local_tools_do_not_load_the_http_client(tmp_path: Path) -> None:
    """What a `crag search` process imports: no http.client / ssl until a remote tool runs."""
    import subprocess
    import sys

    code = (
        "import sys; from crag.config import Settings; from crag.tools import Toolbox; "
        f"box = Toolbox(Settings(index_dir={str(tmp_path / 'ix')!r})); "
        "print(sorted({'http.client', 'ssl', 'html.parser'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_parallel_calls_are_safe(env) -> None:
    box, _, _ = env
    calls = [ToolCall("vector_search", {"query": q}) for q in ("retries", "port 8080", "logs", "pip install")] * 5
    calls += [ToolCall("grep_search", {"pattern": "retr"})] * 5
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(box.run, calls))
    assert all(results[i] == results[i % 4] for i in range(20))


def test_grep_search_literal_case_insensitive_with_windows(env) -> None:
    box, _, _ = env
    items = run(box, "grep_search", pattern="RETRIES")
    by_source = {(i.source, i.anchor_line) for i in items}
    assert ("kb/setup.md", 5) in by_source and ("kb/code/client.py", 1) in by_source
    retries = next(i for i in items if i.source == "kb/setup.md" and i.anchor_line == 7)
    assert (retries.start_line, retries.end_line) == (5, 9)
    assert retries.text == "\n".join(SETUP.split("\n")[4:9])
    first = next(i for i in items if i.source == "kb/code/client.py" and i.anchor_line == 1)
    assert first.start_line == 1 and first.end_line == 3
    assert not any(".env" in i.source for i in run(box, "grep_search", pattern="hunter2"))
    assert run(box, "grep_search", pattern="a.b") == []  # literal: the dot is a dot


def test_grep_search_regex_glob_and_cap(env) -> None:
    box, kb, _ = env
    items = run(box, "grep_search", pattern=r"port \d{4}", regex=True)
    assert [(i.source, i.anchor_line) for i in items] == [("kb/setup.md", 12)]
    assert [i.source for i in run(box, "grep_search", pattern="retr", glob="*.py")] == ["kb/code/client.py"] * 2
    assert {i.source for i in run(box, "grep_search", pattern="retr", glob="notes/*")} == {"kb/notes/faq.txt"}
    with pytest.raises(ToolError, match="invalid regular expression"):
        run(box, "grep_search", pattern="(unclosed", regex=True)
    write(kb / "many.md", "\n".join(f"needle {i}" for i in range(700)))
    assert len(run(box, "grep_search", pattern="needle")) == 500  # the scan's bound; tool_exec keeps 2 x top_k


def test_grep_search_sees_every_file_the_index_holds_however_large(env) -> None:
    """A 3 MiB text file is in the index and read_file reads it: grep_search searches it too."""
    box, kb, _ = env
    filler = "filler line with ordinary words about weather and tea\n" * 60_000
    write(kb / "big.md", filler + "The secret codeword is xylophone-42.\n")
    assert (kb / "big.md").stat().st_size > 3 * 1024 * 1024
    for args in ({"pattern": "xylophone"}, {"pattern": r"xylo\w+-\d+", "regex": True}):
        [item] = run(box, "grep_search", **args)
        assert (item.source, item.anchor_line) == ("kb/big.md", 60_001), args
    [read] = run(box, "read_file", path="big.md", start_line=60_001)
    assert read.text == "The secret codeword is xylophone-42."


def test_read_file_ranges_and_caps(env) -> None:
    box, kb, _base = env
    [item] = run(box, "read_file", path="setup.md", start_line=5, end_line=8)
    assert item.source == "kb/setup.md" and (item.start_line, item.end_line) == (5, 8)
    assert item.text == "\n".join(SETUP.split("\n")[4:8])
    [whole] = run(box, "read_file", path="kb/notes/faq.txt")  # relative to cwd works too
    assert whole.start_line == 1 and whole.end_line == 4
    [absolute] = run(box, "read_file", path=str(kb / "code" / "client.py"), start_line=4)
    assert absolute.text.startswith("def upload")
    write(kb / "long.md", "\n".join(f"line {i}" for i in range(1, 1001)))
    [capped] = run(box, "read_file", path="long.md", start_line=10)
    assert (capped.start_line, capped.end_line) == (10, 209)
    write(kb / "wide.md", "\n".join("w" * 999 for _ in range(150)))  # lines of 1,000 characters with their break
    [wide] = run(box, "read_file", path="wide.md")
    assert (wide.start_line, wide.end_line) == (1, 100) and len(wide.text) == 100 * 1000 - 1  # 100,000 at most
    write(kb / "min.js", "x" * 300_000 + "\nnext line\n")  # one minified line: its start, cut at the cap
    [minified] = run(box, "read_file", path="min.js")
    assert (minified.start_line, minified.end_line) == (1, 1) and minified.text == (
        "x" * 100_000 + " [... line 300,000 characters long, cut at 100,000]")
    with pytest.raises(ToolError, match="has 12 lines"):
        run(box, "read_file", path="setup.md", start_line=50)
    with pytest.raises(ToolError, match="before start_line"):
        run(box, "read_file", path="setup.md", start_line=5, end_line=2)
    with pytest.raises(ToolError, match="no file"):
        run(box, "read_file", path="missing.md")
    for folder in ("notes", "kb/notes", str(kb)):  # was "no file notes in the knowledge base", though it is there
        with pytest.raises(ToolError, match=rf"^read_file: {re.escape(folder)} is a folder: give the path of one of its files$"):
            run(box, "read_file", path=folder)


def test_read_file_of_a_path_crag_showed_reads_that_file_from_a_folder_inside_a_root(tmp_path: Path) -> None:
    """Working in a root's subfolder, crag shows ``kb/sub/backup.md`` as ``backup.md`` (under
    the working folder) and ``kb/backup.md`` absolute. ``read_file("backup.md")``, the path a
    search or a citation gave, read ``kb/backup.md``: another file than the one shown."""
    kb = tmp_path / "kb"
    write(kb / "backup.md", "# Backups\n\nBackups are kept for 30 days.\n")
    shown = write(kb / "sub" / "backup.md", "# Sub\n\nThe sub team keeps its backups for 7 days.\n")
    cfg = Settings(index_dir=str(tmp_path / "idx"))
    ensure_indexed(cfg, [kb])
    box = Toolbox(cfg, roots=[kb], cwd=shown.parent)
    try:
        [hit] = [i for i in run(box, "vector_search", query="sub team backups 7 days") if "7 days" in i.text]
        assert hit.source == "backup.md"
        [item] = run(box, "read_file", path=hit.source)
        assert "7 days" in item.text and item.source == "backup.md"
        [other] = run(box, "read_file", path=str(kb / "backup.md"))  # as crag shows it: absolute
        assert "30 days" in other.text
        assert "30 days" in run(box, "read_file", path="../backup.md")[0].text
    finally:
        box.close()


def test_read_file_of_blank_lines_is_no_evidence(env) -> None:
    """Lines holding only whitespace are no evidence (SPEC §1: synthesis with no evidence makes
    no LLM call): a blank file is as empty as an empty one, a blank range says it holds no text."""
    box, kb, _base = env
    write(kb / "blank.md", "\n\n   \n\t\n")
    with pytest.raises(ToolError, match=r"^read_file: blank\.md is empty$"):
        run(box, "read_file", path="blank.md")
    write(kb / "gap.md", "Title\n\n\n\nBody text.\n")
    with pytest.raises(ToolError, match=r"^read_file: lines 2-4 of gap\.md hold no text$"):
        run(box, "read_file", path="gap.md", start_line=2, end_line=4)
    [body] = run(box, "read_file", path="gap.md", start_line=2)
    assert body.text.strip() == "Body text."


def test_read_file_finds_a_name_written_in_another_unicode_form_than_on_disk(env) -> None:
    """macOS writes file names decomposed (NFD); a keyboard, an MCP client's model and the
    planner write them composed (NFC). "kb/naïve/café.md" typed composed said "no file ... in
    the knowledge base" for a folder and a file named decomposed, and the other way round."""
    box, kb, base = env
    nfd = functools.partial(unicodedata.normalize, "NFD")
    write(kb / nfd("naïve") / nfd("café.md"), "The espresso machine is cleaned daily.\n")
    write(kb / "서울.md", "The Seoul office opens at nine.\n")
    cafe = nfd("kb/naïve/café.md")  # the file's own name, as the evidence carries it
    for path, source in (("kb/naïve/café.md", cafe), (str(kb / "naïve" / "café.md"), cafe),
                         ("naïve/café.md", cafe), (nfd("kb/서울.md"), "kb/서울.md")):
        [read] = run(box, "read_file", path=path)
        assert read.source == source and read.text.startswith("The "), (path, read.source)
    with pytest.raises(ToolError, match="is outside the knowledge base"):
        run(box, "read_file", path=unicodedata.normalize("NFC", str(base / "outside" / "secret.md")))


def test_read_file_finds_a_name_in_another_unicode_form_under_the_home_folder(env, monkeypatch) -> None:
    """A path from the home folder (``~/...``), read as everywhere else, found no file named in
    another Unicode form than the one typed: the home folder was looked for as a folder named "~"."""
    box, kb, base = env
    monkeypatch.setenv("HOME", str(base))
    write(kb / unicodedata.normalize("NFD", "café.md"), "The espresso machine is cleaned daily.\n")
    [read] = run(box, "read_file", path="~/work/kb/café.md")
    assert read.text.startswith("The espresso machine")
    with pytest.raises(ToolError, match="is outside the knowledge base"):
        run(box, "read_file", path="~/outside/secret.md")


@pytest.mark.parametrize(
    "path",
    ["../outside/secret.md", "../../outside/secret.md", "{outside}/secret.md", ".env", "kb/.env", "/etc/passwd",
     "link-out.md", "linkdir/secret.md", "setup.md/../../outside/secret.md"],
)
def test_read_file_refuses_paths_out_of_the_roots(env, path: str) -> None:
    box, kb, base = env
    (kb / "link-out.md").symlink_to(base / "outside" / "secret.md")
    (kb / "linkdir").symlink_to(base / "outside", target_is_directory=True)
    with pytest.raises(ToolError) as err:
        run(box, "read_file", path=path.format(outside=base / "outside"))
    assert "launch code" not in str(err.value)


def test_read_file_takes_back_the_escaped_path_crag_shows_for_a_name_with_control_characters(env) -> None:
    """docs/mcp.md: paths are shown as everywhere in crag and ``read_file`` accepts them back. A
    name with a newline or an escape sequence is shown escaped (``a\\nb.md``); reading that label
    said "no file ... in the knowledge base", so neither an MCP client nor the planner could open it.
    The evidence itself carries the file's own name, and reading that gives the same item."""
    box, kb, base = env
    for name, shown in (("a\nb.md", "kb/a\\nb.md"), ("bell\x07\x1b[31m.md", "kb/bell\\x07\\x1b[31m.md")):
        write(kb / name, "The backup runs at noon.\n")
        ensure_indexed(Settings(index_dir=str(base / "work" / ".crag")), [kb])
        [hit] = run(box, "vector_search", query="backup runs at noon", top_k=1)
        assert hit.source == f"kb/{name}" and display_name(hit.source) == shown
        for path in (hit.source, shown):
            [read] = run(box, "read_file", path=path)
            assert read.source == hit.source and read.text == "The backup runs at noon."
        (kb / name).unlink()
    write(kb / "empty\x1b[2J.md", "")
    with pytest.raises(ToolError, match=r"^read_file: empty\\x1b\[2J\.md is empty$"):
        run(box, "read_file", path="empty\x1b[2J.md")
    write(kb / "plain\\nname.md", "A literal backslash in the name.\n")  # a label without escapes is taken as it is
    [plain] = run(box, "read_file", path="plain\\nname.md")
    assert plain.text == "A literal backslash in the name."


@pytest.mark.parametrize("path", ["zz\x1b[31mRED\x1b]0;title\x07.md", "/etc/\x1b[2Jpass\nwd", "../a\x9bb\nc"])
def test_read_file_errors_show_the_requested_path_escaped(env, path: str) -> None:
    """Every path crag shows goes through one escaping function (docs/safety.md): the path a
    tool error names too, so a requested name cannot put an escape sequence or a line into
    the one-line message an MCP client or the audit shows."""
    box, _kb, _base = env
    with pytest.raises(ToolError) as err:
        run(box, "read_file", path=path)
    message = str(err.value)
    assert not any(ch in message for ch in "\x1b\x07\x9b\n"), message
    assert "\\x1b" in message or "\\x9b" in message


segment = st.sampled_from(["..", ".", "kb", "outside", "secret.md", "setup.md", "link", "", "~", "etc", "passwd", ".env", "notes"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(segment, min_size=1, max_size=6), absolute=st.booleans())
def test_no_generated_path_reads_outside_the_roots(env, parts: list[str], absolute: bool) -> None:
    box, kb, base = env
    link = kb / "link"
    if not link.exists():
        link.symlink_to(base / "outside", target_is_directory=True)
    path = ("/" if absolute else "") + "/".join(parts)
    try:
        items = run(box, "read_file", path=path)
    except ToolError:
        return
    real_kb = os.path.realpath(kb)
    for item in items:
        assert "launch code" not in item.text and "hunter2" not in item.text
        assert os.path.realpath(base / "work" / item.source).startswith(real_kb + os.sep)


def test_without_an_index_roots_none_is_a_clear_index_error(tmp_path: Path) -> None:
    box = Toolbox(Settings(index_dir=str(tmp_path / "none")))
    with pytest.raises(IndexStoreError, match="no index in"):
        run(box, "vector_search", query="x")
    with pytest.raises(IndexStoreError, match="no index in"):
        run(box, "grep_search", pattern="x")


def test_a_file_root_works_for_all_three_tools(tmp_path: Path) -> None:
    doc = write(tmp_path / "single.md", "# Single\n\nOnly this file is the knowledge base.\n")
    write(tmp_path / "sibling.md", "# Sibling\n\nNot part of it.\n")
    cfg = Settings(index_dir=str(tmp_path / "idx"))
    index_roots(cfg, [doc])
    box = Toolbox(cfg, roots=[doc], cwd=tmp_path)
    assert [i.source for i in run(box, "vector_search", query="only this file")] == ["single.md"]
    assert [i.source for i in run(box, "grep_search", pattern="part of")] == []
    assert run(box, "read_file", path="single.md")[0].end_line == 3
    with pytest.raises(ToolError):
        run(box, "read_file", path="sibling.md")


def test_an_absolute_path_in_a_root_whose_file_is_gone_is_no_file_not_outside(env) -> None:
    """MCP's search gives absolute paths; a file deleted since was "outside the knowledge base:
    only files inside its folders can be read", though the path is in one of them."""
    box, kb, base = env
    for path in (kb / "gone.md", kb / "notes" / "gone.txt", kb / "new" / "dir" / "x.md"):
        with pytest.raises(ToolError, match=rf"no file {re.escape(str(path))} in the knowledge base"):
            run(box, "read_file", path=str(path))
    with pytest.raises(ToolError, match="is outside the knowledge base"):
        run(box, "read_file", path=str(base / "outside" / "gone.md"))
    with pytest.raises(ToolError, match="is outside the knowledge base"):
        run(box, "read_file", path="../nowhere.md")


def test_read_file_takes_a_path_as_a_footer_cites_it(env) -> None:
    # An agent copying "kb/setup.md:L5-L8" from an answer's footer got "no file ... in the knowledge base".
    box, _kb, _ = env
    [item] = run(box, "read_file", path="setup.md:L5-L8")
    assert item.source == "kb/setup.md" and (item.start_line, item.end_line) == (5, 8)
    [one] = run(box, "read_file", path="kb/setup.md:L5")
    assert one.start_line == 5
    [given] = run(box, "read_file", path="setup.md:L5-L8", start_line=2, end_line=3)  # the arguments win
    assert (given.start_line, given.end_line) == (2, 3)
    with pytest.raises(ToolError, match=r"no file missing\.md:L3 in the knowledge base"):
        run(box, "read_file", path="missing.md:L3")


def test_read_file_takes_a_place_as_grep_writes_it_or_a_repository_page_links_it(env) -> None:
    # "setup.md:5" (grep -n) and "setup.md#L5-L8" (a link to the file on a repository's web
    # page) were "no file ... in the knowledge base".
    box, _kb, _ = env
    for path, first, last in (("setup.md:5", 5, None), ("kb/setup.md:5-8", 5, 8), ("setup.md#L5-L8", 5, 8),
                              ("setup.md#L5", 5, None)):
        [item] = run(box, "read_file", path=path)
        assert item.source == "kb/setup.md" and item.start_line == first and last in (None, item.end_line)
    with pytest.raises(ToolError, match=r"read_file: setup\.md has no pages"):
        run(box, "read_file", path="setup.md:p1:5")
    for path in ("setup.md:L5-8", "setup.md:5-L8", "setup.md#5", "setup.md#L0", "setup.md:0", "setup.md#L5-8"):
        with pytest.raises(ToolError, match=rf"no file {re.escape(path)} in the knowledge base"):
            run(box, "read_file", path=path)


def test_read_file_names_the_file_of_a_cited_path_in_its_errors(env) -> None:
    # "kb/setup.md:L999 has 12 lines" (a place has no lines) and "kb/setup.md:p2:L1 has no pages".
    box, _kb, _ = env
    with pytest.raises(ToolError, match=r"read_file: kb/setup\.md has \d+ lines; start_line 999 is past the end$"):
        run(box, "read_file", path="kb/setup.md:L999")
    with pytest.raises(ToolError, match=r"read_file: kb/setup\.md has no pages"):
        run(box, "read_file", path="kb/setup.md:p2:L1")


def test_a_cited_line_or_page_0_is_no_place_in_the_file(env) -> None:
    # "kb/setup.md:L0" read the file from line 1 as if it had been cited so, "kb/setup.md:L0-L0"
    # said "end_line 0 is before start_line 1" (a start_line never given); footers count from 1.
    box, _kb, _ = env
    for path in ("kb/setup.md:L0", "kb/setup.md:L0-L0", "kb/setup.md:L2-L0", "kb/setup.md:p0:L1", "kb/setup.md:L00"):
        with pytest.raises(ToolError, match=rf"no file {re.escape(path)} in the knowledge base"):
            run(box, "read_file", path=path)
