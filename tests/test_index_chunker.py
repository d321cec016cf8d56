"""The chunker: Markdown structure, the token budget, and the exact-lines invariant."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crag.index.chunker import TITLE_CHARS, chunk_text, token_counter
from crag.index.decoding import without_invisible
from crag.index.discover import discover, read_file_text, split_lines

SHARED = Path(__file__).resolve().parents[2] / "shared"
CORPORA = SHARED / "corpora"
COUNT = token_counter()


def check_invariants(text: str, chunks, max_tokens: int) -> None:
    """Every chunk is exactly its lines, or a piece of one line over the budget (its pieces
    join back into it); chunks are in order, never overlap, and none exceeds the budget."""
    lines = split_lines(text)
    previous_end = 0
    pieces: dict[int, list[str]] = {}
    for c in chunks:
        assert 1 <= c.start_line <= c.end_line <= len(lines)
        assert COUNT([c.text])[0] <= max_tokens, (c.start_line, c.end_line)
        if c.text != "\n".join(lines[c.start_line - 1 : c.end_line]):
            assert c.start_line == c.end_line, "only a line over the budget is cut"
            assert c.start_line >= previous_end, "chunks go backwards"
            pieces.setdefault(c.start_line, []).append(c.text)
        else:
            assert c.start_line > previous_end, "chunks overlap or go backwards"
        previous_end = c.end_line
    for n, parts in pieces.items():
        assert "".join(parts) == lines[n - 1] and len(parts) > 1, n
    covered = {n for c in chunks for n in range(c.start_line, c.end_line + 1)}
    for n, line in enumerate(lines, 1):
        if line.strip():
            assert n in covered, f"non-blank line {n} is in no chunk"


@pytest.mark.slow
@pytest.mark.parametrize("corpus", ["fastapi_docs", "hf_hub_docs"])
def test_every_chunk_of_the_real_corpora_is_exactly_its_file_lines(corpus: str) -> None:
    root = CORPORA / corpus
    if not root.is_dir():
        pytest.skip(f"{root} is not available")
    files = discover([root]).files
    assert len(files) > 100
    total = 0
    for f in files:
        _, text = read_file_text(f.path)
        chunks = chunk_text(text, Path(f.path).suffix, count=COUNT)
        # the invariant, checked against an independent reading of the file
        # (less the invisible characters crag drops inside words: the HF docs hold zero-width spaces)
        file_lines = without_invisible(Path(f.path).read_text(encoding="utf-8")).split("\n")
        for c in chunks:
            whole = "\n".join(file_lines[c.start_line - 1 : c.end_line])
            assert whole == c.text or (c.start_line == c.end_line and c.text in whole), (f.path, c.start_line)
        check_invariants(text, chunks, 400)
        total += len(chunks)
    assert total > len(files)


def test_headings_start_chunks_and_give_the_heading_path() -> None:
    body = " ".join(["word"] * 60)
    text = f"# Guide\n\nIntro {body}\n\n## Install\n\n{body} install steps\n\n### Linux\n\n{body} apt\n\n## Usage\n\n{body}\n"
    chunks = chunk_text(text, ".md", max_tokens=100, min_tokens=20)
    starts = [c.text.splitlines()[0] for c in chunks]
    assert starts == ["# Guide", "## Install", "### Linux", "## Usage"]
    assert [c.heading for c in chunks] == ["Guide", "Guide > Install", "Guide > Install > Linux", "Guide > Usage"]
    check_invariants(text, chunks, 100)


def test_small_sections_are_merged_until_min_tokens() -> None:
    text = "# A\n\none\n\n## B\n\ntwo\n\n## C\n\nthree\n"
    chunks = chunk_text(text, ".md", max_tokens=200, min_tokens=50)
    assert len(chunks) == 1
    assert chunks[0].start_line == 1 and chunks[0].end_line == 11


def test_a_code_fence_is_never_cut_when_it_fits() -> None:
    para = " ".join(["alpha"] * 150)
    code = "\n".join(f"    x{i} = {i}" for i in range(15))
    text = f"# T\n\n{para}\n\n```python\n{code}\n\n{code}\n```\n\n{para}\n"
    fence_start = text.split("\n").index("```python") + 1
    fence_end = fence_start + 32
    assert text.split("\n")[fence_end - 1] == "```"
    assert COUNT(["\n".join(text.split("\n")[fence_start - 1 : fence_end])])[0] < 400
    chunks = chunk_text(text, ".md", max_tokens=400, min_tokens=10)
    check_invariants(text, chunks, 400)
    holding = [c for c in chunks if c.start_line <= fence_start <= c.end_line]
    assert len(holding) == 1 and holding[0].end_line >= fence_end
    assert len(chunks) > 1


def test_an_oversized_block_is_cut_at_line_boundaries_and_a_huge_line_into_pieces() -> None:
    long_para = "\n".join(f"line {i} " + "text " * 20 for i in range(100))
    huge_line = "x " * 3000
    text = f"# T\n\n{long_para}\n\n{huge_line}\n"
    chunks = chunk_text(text, ".md", max_tokens=120, min_tokens=10)
    check_invariants(text, chunks, 120)
    assert len(chunks) > 5
    line = split_lines(text).index(huge_line) + 1
    cut = [c for c in chunks if c.start_line == line]
    assert len(cut) >= 3000 * 2 // (120 * 4) and "".join(c.text for c in cut) == huge_line
    assert all(c.text.endswith(" ") for c in cut[:-1])  # cut after a space


def test_a_line_without_spaces_and_a_minified_megabyte_are_cut_within_the_budget() -> None:
    for line in ("漢字" * 20_000, "a" * 50_000, ("{\"k\":[1,2,3],\"v\":\"text\"}" * 30_000)):
        text = f"# T\n\n{line}\n"
        chunks = chunk_text(text, ".md", max_tokens=400, min_tokens=120, count=COUNT)
        check_invariants(text, chunks, 400)
        assert sum(len(c.text) for c in chunks if c.start_line == 3) == len(line)


def test_a_heading_never_ends_a_chunk() -> None:
    para = " ".join(["beta"] * 90)
    text = f"{para}\n\n## Next\n\n{para}\n"
    chunks = chunk_text(text, ".md", max_tokens=100, min_tokens=500)
    check_invariants(text, chunks, 100)
    for c in chunks:
        assert not c.text.splitlines()[-1].startswith("#")


def test_a_heading_before_a_block_over_the_budget_goes_with_its_first_lines() -> None:
    """A section opening with a table (or paragraph) longer than a chunk: its heading was a
    chunk of its own, which search ranked first for the heading's words and which holds
    nothing to answer from."""
    intro = " ".join(["alpha"] * 150)
    table = "\n".join(["| type | description |", "| --- | --- |"]
                      + [f"| Q{i}_K | {i}-bit quantization, super-blocks of {i * 8} weights |" for i in range(60)])
    text = f"# Guide\n\n{intro}\n\n## Quantization Types\n\n{table}\n\n## Next\n\n{intro}\n"
    chunks = chunk_text(text, ".md", max_tokens=200, min_tokens=60)
    check_invariants(text, chunks, 200)
    heading = split_lines(text).index("## Quantization Types") + 1
    first = next(c for c in chunks if c.end_line >= heading)
    assert first.start_line == heading and "| Q0_K |" in first.text
    assert first.heading == "Guide > Quantization Types"
    for c in chunks:  # no chunk is headings and blank lines alone
        assert any(line.strip() and not line.startswith("#") for line in c.text.splitlines()), c


def test_setext_rst_and_python_structure() -> None:
    md = "Title\n=====\n\ntext\n\nSub\n---\n\nmore\n"
    assert [c.heading for c in chunk_text(md, ".md", max_tokens=5, min_tokens=0)][-1] == "Title > Sub"
    rst = "Guide\n=====\n\nintro\n\nInstall\n-------\n\nsteps\n"
    assert chunk_text(rst, ".rst", max_tokens=6, min_tokens=0)[-1].heading == "Guide > Install"
    py = "import os\n\n\ndef first():\n    return 1\n\n\nclass Second:\n    pass\n"
    chunks = chunk_text(py, ".py", max_tokens=8, min_tokens=0)
    assert chunks[-1].heading == "class Second"
    check_invariants(py, chunks, 8)


def test_crlf_and_empty_files() -> None:
    assert chunk_text("", ".md") == []
    assert chunk_text("\n\n  \n", ".md") == []
    assert split_lines("a\nb\n") == ["a", "b"]
    assert split_lines("a\n\nb") == ["a", "", "b"]


markdownish = st.lists(
    st.one_of(
        st.sampled_from(["# H1", "## H2", "### H3 { #anchor }", "```", "~~~", "---", "===", "", "", "- item", "> quote"]),
        st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"), max_size=80),
    ),
    max_size=60,
).map("\n".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=markdownish, max_tokens=st.integers(min_value=4, max_value=200), suffix=st.sampled_from([".md", ".rst", ".py", ".txt", ".json"]))
def test_any_text_chunks_into_exact_ordered_non_overlapping_line_ranges(text: str, max_tokens: int, suffix: str) -> None:
    chunks = chunk_text(text, suffix, max_tokens=max_tokens, min_tokens=max_tokens // 3, count=COUNT)
    check_invariants(text, chunks, max_tokens)


def _one_by_one(lines: list[str]) -> list[int]:
    """Per-line counts from encoding this text alone (the definition of line_counts)."""
    import numpy as np

    text = "\n".join(lines) + "\n"
    ends = np.cumsum([len(COUNT.encoding.decode_single_token_bytes(t)) for t in COUNT.encoding.encode_ordinary(text)])
    starts = np.concatenate([[0], ends[:-1]]).astype(int)
    newlines = [i for i, b in enumerate(text.encode()) if b == 10]
    return [sum(1 for s in starts if (newlines[k - 1] if k else -1) < s <= newlines[k]) for k in range(len(lines))]


line_texts = st.lists(
    st.lists(
        st.text(alphabet=st.sampled_from(list(" \t/.!-#`abcXY01é日🤗'")), max_size=12),
        max_size=6,
    ),
    max_size=6,
)


@settings(max_examples=150, deadline=None)
@given(files=line_texts)
def test_line_counts_of_many_texts_encoded_together_equal_each_text_alone(files: list[list[str]]) -> None:
    many = COUNT.line_counts_many(files)
    assert many == [_one_by_one(f) if f else [] for f in files]
    for f, counts in zip(files, many):
        if f:
            assert sum(counts) == len(COUNT.encoding.encode_ordinary("\n".join(f) + "\n"))


def test_line_counts_with_the_source_text_and_without_a_final_newline() -> None:
    files = [["# T", "", "alpha beta."], ["/slash first", "x"], ["  indented"], ["no newline at end"]]
    texts = ["# T\n\nalpha beta.\n", None, "  indented\n", "no newline at end"]
    assert COUNT.line_counts_many(files, texts) == COUNT.line_counts_many(files) == [_one_by_one(f) for f in files]


def test_a_huge_heading_line_gives_a_short_heading_path() -> None:
    # Every chunk cut from a section carries its heading path (stored, embedded, searched): a
    # heading line of megabytes made each of its thousands of pieces megabytes more, and
    # `crag index` of a 3 MB Markdown file was killed for want of memory (18 GB).
    words = " ".join(f"w{i}" for i in range(20000))
    text = f"# {words}\n\nThe platypus.\n\n## Sub {words}\n\nThe echidna.\n"
    chunks = chunk_text(text, ".md", max_tokens=400, min_tokens=120)
    assert all(len(c.heading) <= 2 * TITLE_CHARS + 3 for c in chunks)
    assert chunks[0].heading.startswith("w0 w1 w2") and " > Sub w0 w1" in chunks[-1].heading
    check_invariants(text, chunks, 400)
    for text, suffix in ((f"def f({'x, ' * 50000}y):\n    return 1\n", ".py"), (f"{words}\n{'=' * len(words)}\n\nText.\n", ".rst")):
        chunks = chunk_text(text, suffix, max_tokens=400, min_tokens=120)
        assert all(len(c.heading) <= TITLE_CHARS for c in chunks), suffix
        check_invariants(text, chunks, 400)
