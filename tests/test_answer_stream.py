"""The streamed answer in ``crag chat`` ends up exactly as ``compose`` prints it, however the text arrives."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from crag.answer import STATS_HEADING, StreamRenderer, compose
from crag.prompts import clean_answer, strip_think
from crag.safe_text import ShownStream, redact
from crag.state import Completion, EvidenceItem, Usage

ITEMS = (
    EvidenceItem("vector_search", "docs/setup.md", "The server listens on 8080.", 7, 7, score=0.8),
    EvidenceItem("grep_search", "docs/retry.md", "retries three times", 12, 12, anchor_line=12),
    EvidenceItem("web_fetch", "https://example.com/page", "page text"),
)
USAGE = Usage(model="m").add("synthesize", Completion("x", "m", 10, 5, 12.0))

REPLIES = [
    "It listens on 8080 [1] and retries three times [2].",
    "<think>which one? [3]</think>Retries [2], port [1][3], and [7] is not evidence.",
    "Port [1, 2].\n\n---\n" + STATS_HEADING + "\n- **API calls:** 9",
    "- first point [3]\n- second point [2]\n\n```\ncode [1]\n```\nDone [1].",
    "No citations at all.",
    "Port [1], retries [2].\n\nSources:\n[1] docs/setup.md:L7\n[2] docs/other.md:L5\n- [3]: https://example.com/x",
    "As the evidence says, [1], [2], [7], and [3], it listens on 8080 [9], [8].",
    "Port [1] and [2] & [3]; [4] and retries [2], [1].",
    "Port [[1]] and retries [²], [1]]] then [[9]] and `a[[2]]` [[2], [3]].",
]


def streamed(reply: str, cuts: list[int], every: int = 0) -> str:
    renderer = StreamRenderer(len(ITEMS), clean_answer, strip_think, every=every)
    pieces, last = [], 0
    for cut in [*sorted(set(cuts)), len(reply)]:
        pieces.append(renderer.feed(reply[last:cut]))
        last = cut
    final, _ = compose(clean_answer(reply), ITEMS, USAGE)
    return "".join(pieces) + renderer.rest(final), final


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(REPLIES), st.data())
def test_any_chunking_of_a_reply_prints_exactly_the_final_answer(reply: str, data) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(reply)), max_size=12))
    shown, final = streamed(reply, cuts)
    assert shown == final
    assert shown.count(STATS_HEADING) == 1


def test_markers_are_renumbered_while_streaming() -> None:
    renderer = StreamRenderer(len(ITEMS), clean_answer, strip_think, every=0)
    assert renderer.feed("Retries [") == ""  # a marker in the making, and text a lone </think> could drop
    assert renderer.feed("2] and port [1].") == "Retries [1] and port [2]."  # a cited sentence: the answer began
    assert renderer.feed("<think>hidden") == ""


PIECES = ["Port ", "[1]", "[2, 3]", "[9]", ", ", " and ", ", and ", "; ", "\n", "\n\n", "---", "- item ", "**bold** ", "📊 **LLM Usage Stats:**",
          "LLM Usage Stats", "<think>", "<think>[2] hm</think>", "`code`", "text. ", "# Heading", "[", "]", " "]
FENCE = "\n```\nx = [1]\n```\n"


@settings(max_examples=3000, deadline=None)
@given(st.lists(st.sampled_from([*PIECES, FENCE, "</think>", "<THINKING>", "</reasoning>", "<thi", "Done [1]. "]),
                max_size=25), st.data())
def test_any_reply_streams_to_exactly_the_final_answer(pieces: list[str], data) -> None:
    reply = "".join(pieces)
    cuts = data.draw(st.lists(st.integers(0, len(reply)), max_size=10))
    shown, final = streamed(reply, cuts, every=data.draw(st.sampled_from([0, 8, 32])))
    assert shown == final


def test_a_comma_after_a_code_block_waits_for_a_marker_naming_no_item() -> None:
    """", [9]; " after a fence becomes ";": the comma shown at once would be taken back."""
    reply = "\n```\nx = [1]\n```\n, [9]; "
    for cut in range(len(reply) + 1):
        shown, final = streamed(reply, [cut])
        assert shown == final, cut


def test_a_line_ending_in_a_comma_waits_for_a_marker_naming_no_item() -> None:
    """"Port ," may go on with " [9]," (no item 9): the run goes with a separator, "Port,"."""
    reply = "Port [1]\nPort , [9], "
    for cut in range(len(reply) + 1):
        shown, final = streamed(reply, [cut])
        assert shown == final, cut


@pytest.mark.parametrize("reply", ["The server listens on port 8080 (1). The request timeout is 30 seconds [1].",
                                   "Port 8080 [1]. Its exit status is (2). Port 8080 (1)."])
def test_a_number_in_parentheses_streams_as_the_final_answer_reads_it(reply: str) -> None:
    for cut in range(len(reply) + 1):
        shown, final = streamed(reply, [cut])
        assert shown == final, cut


def test_a_bracket_before_a_marker_waits_for_one_that_pairs_with_it() -> None:
    """"[[1]Port" reads as "[1]Port" until a "]" later on the line pairs with the first "[":
    shown at once, the stream took back a bracket the final answer keeps (hypothesis found it)."""
    reply = "[1]\n[[1]Port ]"
    for cut in range(len(reply) + 1):
        shown, final = streamed(reply, [cut])
        assert shown == final, cut


def test_a_bracket_before_a_marker_in_the_making_waits_with_it() -> None:
    """"Done [1]. [[" showed its first "[" while the second was held back; "[[9]" names no item
    and the final answer drops it whole, so the shown "[" was taken back and the answer printed
    again after it (found by the property test below)."""
    reply = "; Done [1]. [[9]"
    for cut in range(len(reply) + 1):
        shown, final = streamed(reply, [cut])
        assert shown == final, cut


@settings(max_examples=1000, deadline=None)
@given(st.lists(st.sampled_from([*PIECES, "```", "`"]), max_size=25), st.data())
def test_unbalanced_backticks_never_lose_the_final_answer(pieces: list[str], data) -> None:
    # Stray fences and backticks change what counts as code once they close: held back until then.
    reply = "".join(pieces)
    cuts = data.draw(st.lists(st.integers(0, len(reply)), max_size=10))
    shown, final = streamed(reply, cuts)
    assert shown == final


# -- secrets a server echoes while the answer streams ---------------------------------------

SECRETS = ("sk-live-Secret-0123456789", "jira tok 42")  # a token may hold a space
SECRET_PIECES = [*PIECES, "sk-live-Secret-0123456789", "sk-live-", "Secret-0123456789", "jira tok 42", "jira ",
                 "Bearer abcdefgh123 ", "Authorization: Bearer ", "token=zzzzzz9", "https://bob:hunter2pass@db.example/ ",
                 "https://bob:", "hunter2pass@x ", "sk-"]


def streamed_redacted(reply: str, cuts: list[int], every: int, secrets=SECRETS,
                      whole_words: bool = True) -> tuple[list[str], str, str]:
    """What a terminal shows: the rendered stream through ``ShownStream``, as ``crag chat`` prints
    it (``whole_words`` off: each chunk's last word at once, as the rendered chunks are final)."""
    renderer = StreamRenderer(len(ITEMS), clean_answer, strip_think, every=every)
    screen = ShownStream(secrets, whole_words=whole_words)
    pieces, last = [], 0
    for cut in [*sorted(set(cuts)), len(reply)]:
        pieces.append(screen.feed(renderer.feed(reply[last:cut])))
        last = cut
    answer = compose(clean_answer(reply), ITEMS, USAGE)[0]
    pieces.append(screen.feed(renderer.rest(answer)))
    final = redact(answer, secrets)
    return pieces, screen.rest(redact(screen.text, secrets)), final


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from(SECRET_PIECES), max_size=25), st.data())
def test_a_streamed_answer_is_redacted_as_the_printed_one(pieces: list[str], data) -> None:
    reply = "".join(pieces)
    cuts = data.draw(st.lists(st.integers(0, len(reply)), max_size=12))
    every = data.draw(st.sampled_from([0, 8, 32]))
    whole_words = data.draw(st.booleans())
    shown, rest, final = streamed_redacted(reply, cuts, every, whole_words=whole_words)
    screen = "".join(shown) + rest
    assert screen == final  # the whole redacted answer, exactly
    assert not any(secret in screen for secret in SECRETS)
    unredacted = compose(clean_answer(reply), ITEMS, USAGE)[0]
    if not any(secret in unredacted for secret in SECRETS):  # credential-shaped words are the model's own
        # nothing is masked: the screen is what it is with no secret configured (the text
        # itself may hold "***": "**bold** [9]**bold**" renders "**bold****bold**")
        plain, plain_rest, _ = streamed_redacted(reply, cuts, every, (), whole_words)
        assert screen == "".join(plain) + plain_rest


def test_a_secret_split_across_chunks_is_held_back_then_redacted() -> None:
    screen = ShownStream(SECRETS)
    assert screen.feed("Your key is sk-li") == "Your key is "
    assert screen.feed("ve-Secret-01234") == ""
    assert screen.feed("56789 and more") == "*** and "
    assert screen.feed(" text from jira t") == "more text from "
    assert screen.rest(redact("Your key is sk-live-Secret-0123456789 and more text from jira tok 42.", SECRETS)) == "***."


def test_a_lone_closing_tag_of_any_thinking_name_is_a_way_the_reply_may_go_on() -> None:
    # "</reasoning>" after an unclosed <think> makes everything before it reasoning: "Port" is
    # not shown while that can still happen (found by hypothesis).
    reply = "Port <think><THINKING></think><think></reasoning>"
    shown, final = streamed(reply, [37])
    assert shown == final


def test_markers_alone_are_not_shown_before_a_word() -> None:
    """A reply of markers alone is answered with crag's own sentence: "[1]" shown at once would be taken back."""
    renderer = StreamRenderer(len(ITEMS), clean_answer, strip_think, every=0)
    assert renderer.feed("[1]") == "" and renderer.feed(" [2]\n") == ""
    for reply in ("[1]", "[1] [2]\n", "[1]<think>Which page [2]?</think>\n---\n"):
        for cut in range(len(reply) + 1):
            shown, final = streamed(reply, [cut])
            assert shown == final, (reply, cut)


def test_a_run_of_markers_naming_no_item_goes_with_its_and() -> None:
    """", [9] and [9]" after a fence leaves ",": the space after the comma shown while " a"
    was still growing would be taken back."""
    reply = "[1]\n```\nx = [1]\n```\n, [9] and [9]"
    for cut in range(len(reply) + 1):
        for every in (0, 8):
            shown, final = streamed(reply, [cut], every=every)
            assert shown == final, (cut, every)
