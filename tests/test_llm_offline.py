"""The offline backend: rule-based replies that pass the same strict parsers as a model's."""

from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crag import Agent, prompts
from crag.answer import NO_EVIDENCE
from crag.config import Settings
from crag.llm.offline import OFFLINE_PREFACE, OfflineChatModel
from crag.llm.quotes import item_quotes
from crag.ports import AnalyzeTask, GradeTask, LLMRequest, PlanTask, SynthesizeTask
from crag.state import Complexity, EvidenceItem, RoutingPlan, ToolCall, ToolRun
from crag.tools import builtin

from .fakes import FakeToolbox

LOCAL = ("vector_search", "grep_search", "read_file")
ALL = (*LOCAL, "jira_fetch", "confluence_fetch", "web_fetch")
PROPS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MODEL = OfflineChatModel()

UPLOADS = EvidenceItem(
    "vector_search", "docs/uploads.md",
    "# Uploads\nUploads retry three times with exponential backoff.\nThe upload queue lives in Redis.",
    40, 42, 0.62,
)
BILLING = EvidenceItem("vector_search", "docs/billing.md", "Invoices are sent monthly.", 3, 3, 0.41)
README = EvidenceItem("read_file", "README.md", "crag answers questions.", 1, 1)


def ask(task) -> str:
    node = {AnalyzeTask: "analyze_and_route", PlanTask: "plan", GradeTask: "grade_evidence",
            SynthesizeTask: "synthesize"}[type(task)]
    completion = MODEL.complete(LLMRequest(node, task, prompts.render(task)))
    assert completion.billable is False and completion.model == "offline"
    assert completion.prompt_tokens == completion.completion_tokens == 0
    assert completion.latency_ms >= 0
    return completion.text


def route(question: str, tools=LOCAL, attempts=()) -> RoutingPlan:
    text = ask(AnalyzeTask(question, (), builtin(*tools), attempts))
    plan = prompts.parse_route(text, tools)
    assert plan is not None, text
    return plan


def plan_calls(question: str, routing: RoutingPlan, tools=LOCAL, evidence=(), attempts=(), top_k=5):
    text = ask(PlanTask(question, routing, tuple(evidence), tuple(attempts), builtin(*tools), top_k))
    calls, reasons = prompts.parse_plan(text, question, routing, builtin(*tools), top_k)
    assert reasons == (), (text, reasons)
    return calls


# --------------------------------------------------------------------------------------
# analyze_and_route
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("question", ["hi", "Hello there!", "thanks, that helped a lot", "Good morning",
                                      "bye", "你好", "谢谢", "who are you?", "how are you?"])
def test_small_talk_is_chitchat(question):
    assert route(question).complexity is Complexity.CHITCHAT


@pytest.mark.parametrize("question,tools", [
    ("What is an LFS pointer?", {"vector_search"}),
    ("Where is `max_retries` set?", {"vector_search", "grep_search"}),
    ("Show me docs/setup.md", {"vector_search", "read_file"}),
    ("hello, what does KB_AGENT_TOP_K do?", {"vector_search", "grep_search"}),
])
def test_a_single_fact_identifier_or_path_is_simple(question, tools):
    plan = route(question)
    assert plan.complexity is Complexity.SIMPLE
    assert set(plan.suggested_tools) == tools


def test_open_questions_are_complex():
    plan = route("How do uploads recover when the network fails and why is the queue in Redis?")
    assert plan.complexity is Complexity.COMPLEX
    assert plan.suggested_tools == ("vector_search", "grep_search")


def test_remote_tools_are_suggested_only_with_their_pattern_and_when_available():
    plan = route("What is the status of FSR-123的状态 and https://example.com/x page 123456?", ALL)
    assert {"jira_fetch", "web_fetch", "confluence_fetch"} <= set(plan.suggested_tools)
    assert "jira_fetch" not in route("What is the status of FSR-123?", LOCAL).suggested_tools
    assert "jira_fetch" not in route("Is UTF-8 supported with GPT-4?", ALL).suggested_tools


def test_a_re_retrieval_widens_the_tools():
    attempts = (ToolRun(1, ToolCall("vector_search", {"query": "q", "top_k": 5}), ()),)
    assert set(route("How do uploads retry?", LOCAL, attempts).suggested_tools) == set(LOCAL)


# --------------------------------------------------------------------------------------
# plan
# --------------------------------------------------------------------------------------


def test_first_round_plan_searches_the_question_and_greps_identifiers():
    question = "Why does `upload_queue` ignore --dry-run in docs/setup.md?"
    routing = RoutingPlan(Complexity.COMPLEX, LOCAL)
    calls = plan_calls(question, routing)
    assert calls[0] == ToolCall("vector_search", {"query": question, "top_k": 5})
    assert ToolCall("grep_search", {"pattern": "upload_queue", "regex": False}) in calls
    assert ToolCall("grep_search", {"pattern": "--dry-run", "regex": False}) in calls
    assert ToolCall("read_file", {"path": "docs/setup.md"}) in calls


def test_plan_uses_only_suggested_tools_and_remote_tools_with_patterns():
    question = "What is FSR-7 about?"
    routing = RoutingPlan(Complexity.SIMPLE, ("vector_search", "jira_fetch"))
    calls = plan_calls(question, routing, ALL)
    assert [c.tool for c in calls] == ["vector_search", "jira_fetch"]
    assert calls[1].args == {"key": "FSR-7"}


def test_refine_rounds_differ_from_earlier_rounds():
    question = "How do uploads retry on failure?"
    routing = RoutingPlan(Complexity.COMPLEX, LOCAL)
    first = plan_calls(question, routing)
    attempts = tuple(ToolRun(1, c, (UPLOADS,)) for c in first)
    second = plan_calls(question, routing, evidence=(UPLOADS,), attempts=attempts)
    attempts += tuple(ToolRun(2, c, ()) for c in second)
    third = plan_calls(question, routing, evidence=(UPLOADS,), attempts=attempts)
    rounds = [{json.dumps([c.tool, dict(c.args)], sort_keys=True) for c in r} for r in (first, second, third)]
    assert rounds[0].isdisjoint(rounds[1]) and rounds[1].isdisjoint(rounds[2]) and rounds[0].isdisjoint(rounds[2])
    vector = next(c for c in second if c.tool == "vector_search")
    assert vector.args["query"] != question and vector.args["top_k"] > 5
    assert ToolCall("read_file", {"path": "docs/uploads.md", "start_line": 25, "end_line": 72}) in second


def test_plan_is_deterministic():
    task = PlanTask("How do uploads retry?", RoutingPlan(Complexity.COMPLEX, LOCAL), (UPLOADS,), (), builtin(*LOCAL), 5)
    assert ask(task) == ask(task)


@pytest.mark.parametrize("question", [
    "how do uploads retry " * 600,               # 12,000 characters of words
    "x" * 10_000,                                 # one word longer than any query may be
    "why does " + "a_" * 400 + "b fail?",         # an identifier longer than a grep pattern may be
    "read " + "d/" * 2100 + "x.md please",        # a path longer than read_file accepts
    "\x00", "\x01\x02", "\x00 \x1b[31m", "?!...", "the of and",
])
def test_a_hostile_or_huge_question_is_planned_within_the_checkers_limits(question):
    routing = RoutingPlan(Complexity.COMPLEX, LOCAL)
    earlier = (ToolRun(1, ToolCall("vector_search", {"query": question, "top_k": 5}), (UPLOADS,)),)
    for evidence, attempts in (((), ()), ((UPLOADS,), earlier)):
        calls = plan_calls(question, routing, evidence=evidence, attempts=attempts)  # asserts no refusal
        assert any(c.tool == "vector_search" for c in calls)
        assert all(len(str(v)) <= 4000 for c in calls for v in c.args.values())


# --------------------------------------------------------------------------------------
# grade and synthesize
# --------------------------------------------------------------------------------------


def test_grading_gives_one_score_per_item_ranking_the_relevant_higher():
    text = ask(GradeTask("How do uploads retry?", (UPLOADS, BILLING, README)))
    scores = prompts.parse_scores(text, 3)
    assert scores is not None
    assert scores[0] >= 0.7 > scores[1]
    assert scores[1] < 0.3  # unrelated evidence would be dropped
    assert scores[2] < 0.3  # lines read by read_file are graded by what they say


def test_offline_grades_tell_an_answering_passage_from_scattered_words():
    question = "How many times do uploads retry and what backoff do they use?"
    answering = EvidenceItem("read_file", "docs/uploads.md", "Uploads retry three times.\nThe backoff is exponential.", 4, 5)
    scattered = EvidenceItem(
        "vector_search", "docs/misc.md",
        "\n".join(["Uploads are stored in S3."] + ["Unrelated filler text here."] * 8
                   + ["A retry button exists in the UI."] + ["More filler."] * 8 + ["Backoff is a term from networking."]),
        1, 19, 0.9,
    )
    answer, scatter = prompts.parse_scores(ask(GradeTask(question, (answering, scattered))), 2)
    assert answer >= 0.7  # covers the question in a few lines: "answers it"
    assert scatter < answer  # the same words spread over a page, despite a high vector score


def test_offline_grade_ignores_the_tools_own_score():
    low, high = (EvidenceItem("vector_search", "docs/uploads.md", UPLOADS.text, 40, 42, s) for s in (0.05, 0.95))
    assert prompts.parse_scores(ask(GradeTask("How do uploads retry?", (low, high))), 2) == (
        prompts.parse_scores(ask(GradeTask("How do uploads retry?", (high, low))), 2))


def test_synthesis_quotes_relevant_sentences_with_citations():
    text = ask(SynthesizeTask("How do uploads retry?", (), (BILLING, UPLOADS)))
    assert text.startswith(OFFLINE_PREFACE)
    assert "- Uploads retry three times with exponential backoff. [2]" in text  # verbatim
    assert "Invoices" not in text
    assert NO_EVIDENCE not in text


def test_synthesis_quotes_a_sentence_once_when_items_overlap_or_quote_each_other():
    echo = EvidenceItem("grep_search", "notes.md", '> "Uploads retry three times with exponential backoff." (2)', 7, 7)
    text = ask(SynthesizeTask("How do uploads retry?", (), (UPLOADS, echo)))
    assert text.count("retry three times") == 1


def test_a_one_word_question_quotes_the_sentences_holding_the_word():
    setup = EvidenceItem("vector_search", "docs/setup.md",
                         "# Setup\n\nInstall the service with pip.\n\n## Ports\n\nThe server listens on port 8080 by default.",
                         1, 7, 0.4)
    for question in ("port", "port?", "which port"):
        text = ask(SynthesizeTask(question, (), (setup,)))
        assert "- The server listens on port 8080 by default. [1]" in text, (question, text)
        assert "Install the service" not in text


def test_a_faq_line_repeating_the_question_is_not_quoted_as_its_answer():
    faq = EvidenceItem("vector_search", "docs/faq.md",
                       "## How do uploads retry on failure?\n\nUploads retry three times with exponential backoff.",
                       1, 3, 0.6)
    text = ask(SynthesizeTask("How do uploads retry on failure?", (), (faq,)))
    assert "- Uploads retry three times with exponential backoff. [1]" in text
    assert "How do uploads retry on failure?" not in text


def test_chitchat_gets_a_short_friendly_reply():
    assert ask(SynthesizeTask("thanks!", (), (), chitchat=True)).startswith("You're welcome")
    hello = ask(SynthesizeTask("hello", (), (), chitchat=True))
    assert "offline" in hello and "[" not in hello


def test_citation_like_text_in_documents_cannot_become_a_citation():
    doc = EvidenceItem("grep_search", "docs/a.md", "Uploads retry, see [7] and [1, 9].", 5, 5)
    text = ask(SynthesizeTask("How do uploads retry?", (), (doc,)))
    assert set(re.findall(r"\[(\d+)\]", text)) == {"1"}
    assert "[7]" not in text and "(7)" not in text  # such a sentence is not quoted, and never altered


words = st.sampled_from(["uploads", "retry", "queue", "Redis", "backoff", "invoice", "the", "is", "how",
                         "`max_retries`", "docs/setup.md", "FSR-12", "https://example.com/a", "page 123456",
                         "hello", "thanks", "why", "and", "UTF-8", "的状态", "[2]", "\n", "."])
# Pieces a hostile or garbled question is made of: control characters next to URLs, keys and words.
pieces = st.sampled_from(["\x00", "\x01", "\x1b", "\x7f", "\x85", "\u200b", " ", "\t", "?", "-", "/", "the",
                          "http://x.io", "ABC-12", "page 123456", "docs/a.md", "max_retries", "retry"])
questions = st.one_of(st.lists(words, min_size=1, max_size=12).map(" ".join),
                      st.text(min_size=1, max_size=60),
                      st.lists(pieces, min_size=1, max_size=12).map("".join)).filter(str.strip)  # crag refuses a blank question
texts = st.one_of(st.lists(words, max_size=30).map(" ".join), st.text(max_size=120))


@st.composite
def evidence(draw):
    n = draw(st.integers(1, 6))
    tools = st.sampled_from(["vector_search", "grep_search", "read_file", "web_fetch"])
    out = []
    for k in range(n):
        tool = draw(tools)
        out.append(EvidenceItem(tool, f"docs/p{k}.md", draw(texts), k * 10 + 1, k * 10 + 5,
                                draw(st.floats(0, 1)) if tool == "vector_search" else None))
    return tuple(out)


@PROPS
@given(questions, st.lists(st.sampled_from(ALL), unique=True, min_size=1, max_size=6), evidence(),
       st.integers(1, 60))
def test_property_every_offline_reply_passes_the_strict_parsers(question, tools, items, top_k):
    tools = tuple(tools)
    routing = prompts.parse_route(ask(AnalyzeTask(question, (), builtin(*tools))), tools)
    assert routing is not None
    earlier = (ToolRun(1, ToolCall("vector_search", {"query": question, "top_k": top_k}), items),)
    for ev, attempts in (((), ()), (items, earlier)):
        text = ask(PlanTask(question, routing, ev, attempts, builtin(*tools), top_k))
        calls, reasons = prompts.parse_plan(text, question, routing, builtin(*tools), top_k)
        assert calls or "vector_search" not in tools  # without a search of the question, nothing to fall back on
        if "vector_search" in tools and "vector_search" in routing.suggested_tools:
            assert reasons == (), (text, reasons)
        json.loads(text)
    scores = prompts.parse_scores(ask(GradeTask(question, items)), len(items))
    assert scores is not None and len(scores) == len(items)
    answer = prompts.clean_answer(ask(SynthesizeTask(question, (), items)))
    cited = {int(k) for k in re.findall(r"\[(\d+)\]", answer)}
    assert cited and cited <= set(range(1, len(items) + 1))
    assert NO_EVIDENCE not in answer


# --------------------------------------------------------------------------------------
# A whole question, offline
# --------------------------------------------------------------------------------------


def test_an_offline_agent_answers_with_citations_and_zero_llm_calls():
    toolbox = FakeToolbox({"vector_search": [[UPLOADS, BILLING, README]]})
    agent = Agent(OfflineChatModel(), toolbox, Settings())
    result = agent.ask("How do uploads retry?")
    assert result.usage.llm_calls == 0 and result.usage.model == "offline"
    assert "Uploads retry three times" in result.answer
    assert "[1] docs/uploads.md:L41" in result.answer  # the quoted sentence's line, not the chunk's first
    assert "**Model:** offline" in result.answer and "**API calls:** 0" in result.answer


def test_an_offline_greeting_is_answered_without_tools():
    toolbox = FakeToolbox()
    result = Agent(OfflineChatModel(), toolbox, Settings()).ask("hello!")
    assert result.trace == ("analyze_and_route", "synthesize") and toolbox.calls == []
    assert result.answer.startswith("Hello!")


TIP = EvidenceItem("read_file", "docs/hub/trusted-publishers.md", """\
The resulting token can read gated repos you have access to and uses your account's rate limits.

> [!TIP]
> Need the token itself (for `curl`, `git clone`, or a tool that reads `HF_TOKEN`)? `hf auth token` performs the exchange and prints the short-lived token to stdout:
>
> ```yaml
>       - name: Get a short-lived HF token
>         env:
>           HF_OIDC_RESOURCE: your-hf-username  # or a repo, e.g. acme/awesome-model
>         run: echo "HF_TOKEN=$(hf auth token)" >> "$GITHUB_ENV"
> ```
>
> This works with both user publishers and repo publishers — the token is scoped to whatever `HF_OIDC_RESOURCE` points at.

<a id='private-repositories'></a>

- [llama.cpp](./gguf-llamacpp)
- [Ollama](./ollama)
""", 124, 143)


def test_offline_quotes_are_verbatim_and_code_stays_a_code_block():
    text = ask(SynthesizeTask("How do I get a short-lived HF token with hf auth token in a workflow?", (), (TIP,)))
    assert '        run: echo "HF_TOKEN=$(hf auth token)" >> "$GITHUB_ENV"\n```' in text  # not one character changed
    assert "```yaml\n      - name: Get a short-lived HF token\n" in text
    flat_item = " ".join(TIP.text.replace("\n> ", "\n").split())
    for line in text.splitlines()[2:]:
        if line.startswith("- "):
            quote = re.sub(r" \[\d+\]$", "", line[2:])
            assert " ".join(quote.split()) in flat_item, quote


def test_offline_never_quotes_markup_only_lines():
    text = ask(SynthesizeTask("Which private repositories work with llama.cpp, Ollama and the TIP?", (), (TIP,)))
    for markup in ("<a id=", "[!TIP]", "](./gguf-llamacpp)", "](./ollama)"):
        assert markup not in text
    assert set(re.findall(r"\[(\d+)\]", text)) <= {"1"}  # every marker resolves


def test_offline_answer_cites_the_line_where_each_quoted_sentence_starts():
    toolbox = FakeToolbox({"read_file": [[TIP]], "vector_search": [[TIP]]})
    result = Agent(OfflineChatModel(), toolbox, Settings()).ask("What does the resulting token read, and its rate limits?")
    file_lines = TIP.text.splitlines()
    assert result.citations
    for c in result.citations:
        start = file_lines[c.line - TIP.start_line]
        assert start.strip(), c
    assert "[1] docs/hub/trusted-publishers.md:L124" in result.answer


def test_an_offline_quote_grounding_does_not_judge_is_cited_at_its_own_line():
    """A quoted lead-in with no content word of its own ("Use as follows:", which the
    question's "following" matched) kept the item's start line: the footer opened at the
    page's heading (L1), not at L7, where the quoted sentence is (SPEC §7)."""
    item = EvidenceItem(
        "vector_search", "kb/llm.md",
        "# LLM test file { #llm-test-file }\n\nThis document tests if the <abbr title=\"Large Language Model\">"
        "LLM</abbr>, which translates the documentation, understands the `general_prompt`.\n\n"
        "Tests added here will be seen by all designers of language specific prompts.\n\nUse as follows:",
        1, 7, 0.5)
    result = Agent(OfflineChatModel(), FakeToolbox({"vector_search": [[item]]}), Settings()).ask(
        '"title" attributes of "abbr" elements are translated following some')
    assert "- Use as follows: [2]" in result.answer, result.answer
    assert "[1] kb/llm.md:L3\n[2] kb/llm.md:L7\n" in result.answer, result.answer


def _offline_body(question: str, *items: EvidenceItem) -> str:
    """The offline answer's body (no usage block) to ``question`` over ``items`` found by a search."""
    toolbox = FakeToolbox({"vector_search": [list(items)]})
    return Agent(OfflineChatModel(), toolbox, Settings()).ask(question).answer.split("\n\n---\n", 1)[0]


def test_an_offline_quote_keeps_the_references_its_document_writes():
    """The offline answer quotes verbatim (SPEC §7), but grounding read a document's
    "docs/other.md:L2" as an evidence header a model copied, and a Markdown footnote's "[^1]"
    as a marker: the quotes came out as "See [2] for ..." and "... by default.[1]", a
    document's own reference made a citation of crag's."""
    notes = EvidenceItem("vector_search", "docs/notes.md",
                         "# Gateway notes\n\nSee docs/other.md:L2 for the flumox retry budget of 40 attempts.\n\n"
                         "The plimsol cache holds 300 entries by default.[^1]\n\n"
                         "[^1]: Measured on the plimsol test rig.", 1, 7, 0.9)
    other = EvidenceItem("vector_search", "docs/other.md", "# Other\nThe flumox retry budget is 40 attempts per hour.",
                         1, 2, 0.8)

    def ask_offline(question: str) -> str:
        return _offline_body(question, notes, other)

    retries = ask_offline("What is the flumox retry budget?")
    assert "- See docs/other.md:L2 for the flumox retry budget of 40 attempts. [1]" in retries, retries
    assert retries.endswith("[1] docs/notes.md:L3\n[2] docs/other.md:L2"), retries
    cache = ask_offline("How many entries does the plimsol cache hold?")
    assert "- The plimsol cache holds 300 entries by default.[^1] [1]" in cache, cache
    assert "[1] docs/notes.md:L5" in cache and "[1] docs/notes.md:L7" not in cache, cache


def test_offline_quotes_a_line_of_a_numbered_source_list_without_its_label():
    """A document's list of sources or footnotes ("[3] Brown: the gateway listens on port
    7431.") was never quoted: a sentence holding "[3]" is not quoted, and the lines ran on as one
    sentence, so the answer was "The passages found have no quotable text". Each such line is
    quoted without its label, as a list item is without its bullet, and cited at its own line;
    a "[2]" inside a sentence still keeps it from being quoted."""
    refs = EvidenceItem("vector_search", "docs/refs.md",
                        "# Release references\n\nThe release process is described in these sources.\n"
                        "[1] Smith: the staging cluster runs on Kubernetes 1.29.\n"
                        "[2] Jones: nightly backups are kept for thirty days.\n"
                        "[3] Brown: the zorblax gateway listens on port 7431.\n"
                        "[4] Green: the zorblax rollback takes five minutes, as [2] says.", 1, 7, 0.9)

    def ask_offline(question: str) -> str:
        return _offline_body(question, refs)

    port = ask_offline("Which port does the zorblax gateway listen on?")
    assert "- Brown: the zorblax gateway listens on port 7431. [1]" in port, port
    assert port.endswith("\n\n[1] docs/refs.md:L6"), port
    backups = ask_offline("How long are nightly backups kept?")
    assert "- Jones: nightly backups are kept for thirty days. [1]" in backups, backups
    assert backups.endswith("\n\n[1] docs/refs.md:L5"), backups
    assert "as [2] says" not in ask_offline("How long does the zorblax rollback take?")


def test_offline_never_quotes_an_include_directive():
    doc = EvidenceItem("vector_search", "docs/params.md",
                       "Declare a path parameter greater than zero with gt.\n\n"
                       "{* ../../docs_src/path_params_numeric_validations/tutorial002_py310.py hl[7] *}\n", 50, 52, 0.9)
    text = ask(SynthesizeTask("How do I require a numeric path parameter greater than zero?", (), (doc,)))
    assert "{*" not in text and "Declare a path parameter greater than zero with gt. [1]" in text


OKAPI = EvidenceItem("vector_search", "docs/okapi.md", """\
# Okapi service guide

[okapi-service-guide]: https://example.com/okapi/service/storage/guide "Okapi service storage guide"
[okapi-storage]: https://example.com/okapi/storage/buckets
[okapi-data]: https://example.com/okapi/data#L5

{% include okapi_service_storage_banner.html %}

{{< figure src="okapi-service-storage.png" title="Okapi service storage" >}}

{: #okapi-service-storage .okapi-service-guide}

The okapi service stores its data in the okapi bucket for ninety days.
""", 1, 13, 0.9)


def test_offline_never_quotes_link_definitions_template_tags_or_attribute_lists():
    text = ask(SynthesizeTask("Where does the okapi service guide say okapi storage data is kept?", (), (OKAPI,)))
    for markup in ("[okapi-service-guide]:", "[okapi-storage]:", "[okapi-data]:", "{%", "{{<", "{:"):
        assert markup not in text
    assert "- The okapi service stores its data in the okapi bucket for ninety days. [1]" in text

def test_offline_never_quotes_a_restructuredtext_directive():
    """A reStructuredText directive (".. code-block:: bash") is markup, but its name and argument
    made three words, so the offline answer quoted it as a sentence of the file."""
    doc = EvidenceItem("vector_search", "docs/guide.rst",
                       "The gryphon ledger is rebuilt by the gryphon command line.\n\n.. code-block:: bash\n\n"
                       "   gryphon-cli rebuild --ledger\n\n.. image:: gryphon-ledger.png\n", 12, 18, 0.9)
    text = ask(SynthesizeTask("Which gryphon bash code block rebuilds the ledger image?", (), (doc,)))
    assert ".. code-block::" not in text and ".. image::" not in text
    assert "- The gryphon ledger is rebuilt by the gryphon command line. [1]" in text
    # nor one with its options on the lines below it, a substitution's or a link target: the
    # options made the directive a sentence of the file again
    doc = EvidenceItem("vector_search", "docs/guide.rst",
                       "The gryphon ledger is rebuilt by the gryphon command line.\n\n.. |logo| image:: gryphon.png\n\n"
                       ".. code-block:: bash\n   :linenos:\n   :caption: Rebuild the gryphon ledger\n\n"
                       "   gryphon-cli rebuild --ledger\n\n.. _gryphon-ledger-image:\n", 12, 22, 0.9)
    text = ask(SynthesizeTask("Which gryphon bash code block rebuilds the ledger image?", (), (doc,)))
    assert ".. " not in text and ":caption:" not in text, text
    assert "- The gryphon ledger is rebuilt by the gryphon command line. [1]" in text


GIZMO = "---\ntitle: Gizmo reference\nauthor: Ada Lovelace\n---\n\n# Gizmo\n\nThe gizmo reference card ships in the box.\n"


@pytest.mark.parametrize("text", [
    GIZMO,
    GIZMO.replace("---", "+++"),  # TOML front matter (Hugo)
    GIZMO.replace("---\n\n#", "...\n\n#"),  # YAML closed by its end-of-document marker
])
def test_offline_never_quotes_a_files_front_matter(text: str):
    """A file that opens with YAML front matter (`---` / `title: Gizmo reference` / `---`) was
    quoted as "- title: Gizmo reference author: Ada Lovelace [1]": metadata for a site generator,
    not a line of the document. The sentence below it is quoted and cited where it stands."""
    doc = EvidenceItem("vector_search", "docs/gizmo.md", text, 1, 8, 0.9)
    for question in ("gizmo reference", "Who is the author of the gizmo reference?"):
        answer = ask(SynthesizeTask(question, (), (doc,)))
        assert "title:" not in answer and "Ada Lovelace" not in answer, answer
        assert "- The gizmo reference card ships in the box. [1]" in answer, answer
    toolbox = FakeToolbox({"read_file": [[doc]], "vector_search": [[doc]]})
    result = Agent(OfflineChatModel(), toolbox, Settings()).ask("gizmo reference")
    assert [c.line for c in result.citations] == [8] and "title:" not in result.answer, result.answer


def test_offline_quotes_a_rule_and_a_key_line_that_do_not_open_a_file():
    """Only the opening of a file is front matter: a chunk further down that starts with a
    thematic break is prose as any other."""
    doc = EvidenceItem("vector_search", "docs/gizmo.md",
                       "---\nThe gizmo reference card ships in the box.\n---\n\nIt lists every port.\n", 40, 44, 0.9)
    assert "- The gizmo reference card ships in the box. [1]" in ask(SynthesizeTask("gizmo reference", (), (doc,)))


def test_a_file_that_opens_with_a_rule_and_prose_is_quoted_as_prose():
    """Front matter opens with a key ("title: ..."): a file whose first line is a `---` rule
    followed by sentences lost them all to the front-matter rule."""
    doc = EvidenceItem("vector_search", "docs/gizmo.md",
                       "---\nThe gizmo pump weighs 5 kg.\nIt runs at 300 rpm.\n---\n\nMore below.\n", 1, 6, 0.9)
    assert "- The gizmo pump weighs 5 kg. [1]" in ask(SynthesizeTask("How much does the gizmo pump weigh?", (), (doc,)))


def test_a_sentence_below_many_lines_without_a_full_stop_is_still_quoted():
    """Lines with no full stop (a list of settings, a log, filler) run on into the sentence below
    them as one passage; past the longest quotable sentence, the offline answer said "no
    quotable text" although the answer stood on a line of its own. Such a line is quoted."""
    lines = [f"filler line {i}" for i in range(265, 301)] + ["The axolotl regrows limbs quickly."]
    item = EvidenceItem("vector_search", "kb/c.md", "\n".join(lines), 265, 301, 0.5)
    result = Agent(OfflineChatModel(), FakeToolbox({"vector_search": [[item]]}), Settings()).ask("What about the axolotl?")
    assert "- The axolotl regrows limbs quickly. [1]" in result.answer
    assert "[1] kb/c.md:L301" in result.answer

def test_offline_quotes_keep_the_spaces_inside_a_line_and_only_join_wrapped_lines():
    """Whitespace was collapsed everywhere in a quote, so inline code lost a character
    (`SEP="a  b"` quoted as `SEP="a b"`) and a no-break space became a plain one. Only a
    sentence wrapped over lines is put on one line; the rest is quoted as written."""
    item = EvidenceItem("vector_search", "docs/fmt.md", "# Format\n\nThe separator is set with `SEP=\"a  b\"` in the\n"
                        "  config\u00a0file of the exporter.", 1, 4, 0.9)
    text = ask(SynthesizeTask("What is the separator in the config file of the exporter?", (), (item,)))
    assert '- The separator is set with `SEP="a  b"` in the config\u00a0file of the exporter. [1]' in text

def test_offline_never_quotes_a_sentence_cut_inside_an_html_tag():
    """A full stop inside a tag's attribute (``<abbr title="... CSS. It's ...">CDN</abbr>``)
    ended a "sentence" there: the quote held half a tag, its attribute unclosed."""
    item = EvidenceItem("vector_search", "docs/assets.md",
                        'By default, those files are served from a <abbr title="Content Delivery Network: a service '
                        'that provides static files, like JavaScript and CSS. It serves them from a server close to the '
                        'client.">CDN</abbr>.\n\nYou can serve the JavaScript and CSS files of the docs yourself.', 5, 7, 0.9)
    text = ask(SynthesizeTask("How are the JavaScript and CSS files of the docs served?", (), (item,)))
    assert "<abbr" not in text and "title=" not in text
    assert "- You can serve the JavaScript and CSS files of the docs yourself. [1]" in text

def test_a_docx_table_row_is_quoted_as_its_own_line_and_cited_there():
    """A DOCX line is a paragraph or table row; a row (``cell | cell | cell``) is quoted as
    written, cited at its line, not run on from the paragraph above the table."""
    lines = ["Parts list", "The table below lists the parts of the hobblex engine.", "part | material | size",
             "hobblex piston | steel | 8 cm", "hobblex valve | brass | 2 cm", "The hobblex engine was first run in 1931."]
    item = EvidenceItem("vector_search", "kb/parts.docx", "\n".join(lines), 7, 12, 0.5)
    result = Agent(OfflineChatModel(), FakeToolbox({"vector_search": [[item]]}), Settings()).ask(
        "What is the hobblex valve made of?")
    assert "- hobblex valve | brass | 2 cm [2]" in result.answer
    assert "[2] kb/parts.docx:L11" in result.answer


def test_an_offline_quote_keeps_a_space_where_the_file_has_a_line_separator_or_form_feed():
    """U+2028, U+0085, a vertical tab and a form feed inside a line were deleted from the
    quotes ("orangeand", "usescopper"): they part words as a line break does, and the quote
    shows each as one space, on a terminal and in ``--json`` alike."""
    text = ("# Separators\n\nThe gloomwhistle antenna is painted orange\u2028and it was installed in 2019.\n"
            "The gloomwhistle mast uses\x85copper wire.\nThe gloomwhistle dish has a\x0bvertical tab and a\x0cform feed.")
    item = EvidenceItem("vector_search", "kb/seps.md", text, 1, 5, 0.5)
    agent = Agent(OfflineChatModel(), FakeToolbox({"vector_search": [[item]] * 3}), Settings())
    answer = agent.ask("When was the gloomwhistle antenna installed and what wire does the mast use?").answer
    assert "- The gloomwhistle antenna is painted orange and it was installed in 2019. [1]" in answer
    assert "- The gloomwhistle mast uses copper wire. [2]" in answer
    assert "[1] kb/seps.md:L3" in answer and "[2] kb/seps.md:L4" in answer
    answer = agent.ask("What does the gloomwhistle dish have?").answer
    assert "- The gloomwhistle dish has a vertical tab and a form feed. [" in answer


ORG_DOC = ("#+TITLE: Org guide\n\n* Heading\nFiller line 0 about ordinary org matters.\n"
           "Filler line 1 about ordinary org matters.\n\n** Sub\n#+BEGIN_QUOTE\nThe pellucid dynamo yields 5 kilowatts.\n"
           "#+END_QUOTE\nFiller line 2 about ordinary org matters.\n\nThe pellucid dynamo weighs 240 kilograms.\n")


def test_org_markup_lines_are_never_quoted_and_a_quote_is_cited_where_its_sentence_starts():
    """SPEC §7: the offline answer never quotes a line that is only markup and cites the line
    where each quoted sentence starts. Org's block delimiters, keyword lines and headlines
    ran into the sentence below them: "** Sub #+BEGIN_QUOTE The pellucid dynamo yields 5
    kilowatts. #+END_QUOTE Filler ..." was quoted, cited at L7 (``** Sub``) for L9."""
    item = EvidenceItem("vector_search", "kb/doc.org", ORG_DOC, 1, 13, 0.5)
    result = Agent(OfflineChatModel(), FakeToolbox({"vector_search": [[item]]}), Settings()).ask(
        "How much power does the pellucid dynamo yield and what does it weigh?")
    assert "- The pellucid dynamo yields 5 kilowatts. [1]" in result.answer
    assert "[1] kb/doc.org:L9" in result.answer and "[2] kb/doc.org:L13" in result.answer
    assert "#+" not in result.answer and "** Sub" not in result.answer
    quotes = [q for _, q in item_quotes(item, "org guide heading filler")]
    assert "#+TITLE: Org guide" not in quotes and "Filler line 0 about ordinary org matters." in quotes
    # the same lines in a Markdown file are left as they were read: Org's markup is Org's
    assert "#+TITLE: Org guide" in [q for _, q in item_quotes(EvidenceItem("vector_search", "kb/doc.md", ORG_DOC, 1, 13))]


def test_the_text_of_a_container_admonition_is_quoted_without_its_fence_and_cited_at_its_line():
    """Docusaurus, MyST and Pandoc write admonitions as ":::note" ... ":::": the text ran into
    the fence line above it, so its sentence opened with ":::", read as an admonition marker,
    and the offline answer never quoted it."""
    doc = ("# Frobnicator\n\nThe frobnicator must be calibrated before each shift.\n\n:::note\n"
           "The frobnicator calibration log is kept in /var/log/frob.log.\n:::\n\n"
           "::: warning Hot surface\nNever touch the frobnicator while it runs.\n:::\n")
    item = EvidenceItem("vector_search", "kb/frob.md", doc, 1, 12, 0.5)
    result = Agent(OfflineChatModel(), FakeToolbox({"vector_search": [[item]]}), Settings()).ask(
        "Where is the frobnicator calibration log kept?")
    assert "- The frobnicator calibration log is kept in /var/log/frob.log. [" in result.answer, result.answer
    assert ":::" not in result.answer
    assert ("kb/frob.md", 6) in {(c.path, c.line) for c in result.citations}
    quotes = [q for _, q in item_quotes(item, "frobnicator")]
    assert "Never touch the frobnicator while it runs." in quotes and not any(":::" in q for q in quotes)


RUN_DOC = """\
# Run it

Start the server in development mode:

```console
$ fastapi dev main.py

 ╭────────── FastAPI CLI - Development mode ───────────╮
 │  Serving at: http://127.0.0.1:8000                  │
 ╰─────────────────────────────────────────────────────╯
```

In development mode the server reloads when a file changes.
"""


@pytest.mark.parametrize("first, last", [(8, 9), (8, 13)], ids=["an excerpt inside the block", "a chunk starting in it"])
def test_offline_quotes_lines_below_their_fence_as_code(tmp_path, first, last):
    """An item whose text starts inside a code block of its file (an excerpt the context budget
    cut, a chunk of a long block) is quoted as code, verbatim, never as a prose sentence."""
    path = tmp_path / "run.md"
    path.write_text(RUN_DOC, encoding="utf-8")
    lines = RUN_DOC.split("\n")
    item = EvidenceItem("vector_search", str(path), "\n".join(lines[first - 1 : last]), first, last, 0.5)
    text = ask(SynthesizeTask("How do I run FastAPI in development mode?", (), (item,)))
    assert not [line for line in text.splitlines() if line.startswith("- ") and "╭" in line]  # no prose bullet
    code = "\n".join(lines[first - 1 : min(last, 10)])  # up to the closing fence
    assert "```console\n" + code + "\n```\n[1]" in text  # verbatim, under its own fence
    if last == 13:  # the prose after the block is still prose
        assert "- In development mode the server reloads when a file changes. [1]" in text


def test_offline_reads_an_item_on_its_own_when_its_file_no_longer_holds_it(tmp_path):
    path = tmp_path / "run.md"
    path.write_text(RUN_DOC, encoding="utf-8")
    item = EvidenceItem("vector_search", str(path), "In development mode the server restarts on changes.", 9, 9)
    text = ask(SynthesizeTask("What does development mode do?", (), (item,)))
    assert "- In development mode the server restarts on changes. [1]" in text


SETTINGS_YAML = EvidenceItem("vector_search", "deploy/settings.yaml",
                             "server:\n  port: 8080\n  host: example.org\nupload:\n  timeout: 30\n  retries: 4", 1, 6, 0.5)
UPLOAD_PY = EvidenceItem("vector_search", "src/upload.py",
                         'def upload(path, timeout=30):\n    """Upload a file; the timeout is in seconds."""\n'
                         "    return send(path, timeout)", 10, 12, 0.5)


LONG_PY = EvidenceItem("vector_search", "src/long.py", "\n".join(
    [f"ROW_{i} = {'x' * 150!r}" for i in range(5)] + ["UPLOAD_TIMEOUT = 30  # the upload timeout"]
    + [f"COL_{i} = {'y' * 150!r}" for i in range(5)]), 1, 11, 0.5)  # too long to quote whole


@pytest.mark.parametrize("item", [SETTINGS_YAML, UPLOAD_PY, LONG_PY])
def test_offline_quotes_a_code_or_settings_file_as_its_lines_in_a_code_block(item):
    """A source file or a settings file is code: quoted as its lines, not one character
    changed (indentation kept), in a code block, never run together into a "sentence"."""
    toolbox = FakeToolbox({"vector_search": [[item]]})
    result = Agent(OfflineChatModel(), toolbox, Settings()).ask("What is the upload timeout?")
    body = result.answer.split("\n\n---\n")[0]
    block = re.search(r"^(`{3,})[^\n]*\n(.*?)\n\1$", body, re.S | re.M)
    assert block is not None, body
    assert block.group(2) in item.text and "timeout" in block.group(2) and "\n" in block.group(2), body
    assert not [line for line in body.splitlines() if line.startswith("- ") and "timeout" in line], body
    cited = result.citations[0]
    assert cited.path == item.source and item.text.split("\n")[cited.line - item.start_line] in block.group(2)


def test_offline_leaves_a_title_line_out_of_the_sentence_below_it():
    """A PDF page's header (a short line with no full stop, the next line opening a sentence)
    is not quoted as the start of the sentence below it, which is cited at its own line; a
    sentence wrapped over lines is still quoted whole."""
    page = EvidenceItem("vector_search", "docs/guide.pdf",
                        "Page two header\nThe torque wrench must be set to 45 Nm.\nOther text here.", 1001, 1003, 0.5)
    wrapped = EvidenceItem("vector_search", "docs/os.md", "# Systems\n\nThe torque service runs on\nLinux and macOS.", 1, 4, 0.4)
    result = Agent(OfflineChatModel(), FakeToolbox({"vector_search": [[page, wrapped]]}), Settings()).ask(
        "What must the torque wrench be set to, and where does the torque service run?")
    assert "- The torque wrench must be set to 45 Nm. [1]" in result.answer, result.answer
    assert "- The torque service runs on Linux and macOS. [2]" in result.answer, result.answer
    assert "[1] docs/guide.pdf:p2:L2\n[2] docs/os.md:L3\n" in result.answer, result.answer


def test_evidence_with_no_quotable_sentence_is_pointed_at_not_called_no_evidence(tmp_path):
    """A passage the offline answer cannot quote ("hello backups": no sentence) is still the
    evidence found: the answer says so and cites it. Its sentence is crag's own, which grounding
    never judges, so the answer is not turned into "couldn't find" (SPEC §7: that sentence is
    for no evidence at all)."""
    kb = tmp_path / "notes"
    kb.mkdir()
    (kb / "x.md").write_text("hello backups\n")
    with Agent.from_env(kb=[str(kb)], dotenv=None, environ={}, llm="offline",
                        index_dir=str(tmp_path / "index"), log=False) as agent:
        result = agent.ask("backups")
    assert result.answer.split("\n\n---")[0] != NO_EVIDENCE
    assert NO_EVIDENCE not in result.answer
    assert "no quotable text" in result.answer and [c.path.endswith("x.md") for c in result.citations] == [True]


def test_a_sentence_naming_a_tag_in_inline_code_is_quoted():
    """"Wrap the inputs in a `<form>` tag" was taken for a line of HTML markup and never quoted,
    though the tag is inline code in a sentence of prose."""
    item = EvidenceItem("vector_search", "docs/forms.md",
                        "# Forms\n\nWrap the inputs in a `<form>` tag to submit them together.", 1, 3, 0.8)
    result = Agent(OfflineChatModel(), FakeToolbox({"vector_search": [[item]]}), Settings()).ask(
        "How do I submit the inputs together?")
    assert "- Wrap the inputs in a `<form>` tag to submit them together. [1]" in result.answer, result.answer
    assert "[1] docs/forms.md:L3" in result.answer


@pytest.mark.parametrize(("line", "question"), [
    ("Press <kbd>Ctrl</kbd>+<kbd>S</kbd> to save the current notebook immediately.",
     "How do I save the current notebook immediately?"),
    ("Start the billing worker with --port <PORT> and --region <REGION> set.", "How do I start the billing worker?"),
])
def test_a_sentence_of_prose_with_a_tag_in_it_is_quoted(line: str, question: str):
    """A sentence holding any tag (<kbd>, a <PORT> placeholder) was taken for markup and never
    quoted: the answer quoted the passage's other sentence, about something else."""
    item = EvidenceItem("vector_search", "docs/keys.md", f"# Keys\n\nThe editor autosaves every minute.\n\n{line}", 1, 5, 0.8)
    result = Agent(OfflineChatModel(), FakeToolbox({"vector_search": [[item]]}), Settings()).ask(question)
    assert f"- {line} [1]" in result.answer, result.answer
    assert "[1] docs/keys.md:L5" in result.answer


def test_a_short_fact_with_a_number_is_quoted_and_a_two_word_label_is_not():
    """"Port is 99" was "no quotable text" (two words of letters: a label); a number counts as a word."""
    item = EvidenceItem("vector_search", "notes/a.md", "Port is 99\n\nNext steps", 1, 3, 0.8)
    result = Agent(OfflineChatModel(), FakeToolbox({"vector_search": [[item]]}), Settings()).ask("what is the port")
    assert "- Port is 99 [1]" in result.answer and "Next steps" not in result.answer, result.answer


@pytest.mark.parametrize("text", [
    '<p align="center">\n<img src="walrus.png" alt="logo">\n</p>\nThe walrus gateway handles every request in the cluster.',
    '<p align="center">\nThe walrus gateway handles every request in the cluster.\n</p>',
    '<script>document.title = "The walrus gateway handles every request quickly"</script>',
    '<a name="walrus"></a>The walrus gateway handles every request in the cluster.',
])
def test_a_sentence_holding_layout_html_is_markup_however_much_text_it_has(text: str):
    """Once tags were weighed against text, a README's centred logo running into the sentence
    below it was quoted whole (and cited at the <p> line), and so was a script."""
    item = EvidenceItem("vector_search", "kb/p.md", f"# Gateway\n\n{text}", 1, 2 + text.count("\n") + 1, 0.8)
    result = Agent(OfflineChatModel(), FakeToolbox({"vector_search": [[item]]}), Settings()).ask(
        "How does the walrus gateway handle every request?")
    assert "<" not in result.answer.split("\n\n---")[0], result.answer


def test_a_sentence_in_a_script_without_spaces_is_quoted_once_cited_once():
    """A Japanese sentence was "no quotable text" (one run of letters is not three words), and
    a quote ending in 。 got a second marker inside it: "日本語の説明 [1]。 [1]"."""
    item = EvidenceItem("vector_search", "docs/ja.md",
                        "# 設定\n\nサーバーはポート8080で待ち受けます。\nログは毎日ローテーションされます。", 1, 4, 0.8)
    result = Agent(OfflineChatModel(), FakeToolbox({"vector_search": [[item]]}), Settings()).ask(
        "ログは毎日ローテーションされますか？")
    assert "- ログは毎日ローテーションされます。 [" in result.answer, result.answer
    mixed = EvidenceItem("vector_search", "docs/mixed.md", "The widget manual — 日本語の説明。\nThe widget runs on port 8080.",
                         1, 2, 0.8)
    result = Agent(OfflineChatModel(), FakeToolbox({"vector_search": [[mixed]]}), Settings()).ask(
        "What does the widget manual say?")
    assert "- The widget manual — 日本語の説明。 [1]\n" in result.answer, result.answer


def test_offline_quotes_a_table_that_holds_the_answer_as_a_table():
    """A chunk that is a table was answered "The passages found have no quotable text": its
    rows are no sentences. A short table is quoted whole, a long one as its header and the
    rows holding the question's words, each line as written, and cited at a line of it."""
    short = EvidenceItem("vector_search", "docs/limits.md",
                         "# Limits\n\n| limit | value |\n| --- | --- |\n| request timeout | 30 seconds |", 1, 5, 0.5)
    rows = "\n".join(f"| setting {n} | {n} |" for n in range(30))
    long = EvidenceItem("vector_search", "docs/all.md",
                        f"| name | default |\n|:---|---:|\n{rows}\n| upload retries | 3 |", 1, 33, 0.4)
    for item, table in ((short, "| limit | value |\n| --- | --- |\n| request timeout | 30 seconds |"),
                        (long, "| name | default |\n|:---|---:|\n| upload retries | 3 |")):
        question = "What is the request timeout?" if item is short else "How many upload retries?"
        result = Agent(OfflineChatModel(), FakeToolbox({"vector_search": [[item]]}), Settings()).ask(question)
        body = result.answer.split("\n\n---\n")[0]
        assert f"\n{table}\n\n[1]\n" in body, body
        (cited,) = result.citations
        assert cited.path == item.source and item.text.split("\n")[cited.line - item.start_line] in table, cited
        assert result.state.grounding.supported >= 1


def test_a_documents_sentence_opening_with_a_usage_figure_is_quoted():
    """"LLM Usage Stats: 3 calls is what a simple question costs." in a document was never quoted
    offline: taken for a usage block a model wrote on one line."""
    item = EvidenceItem("vector_search", "docs/usage.md",
                        "# Reporting\n\nLLM Usage Stats: 3 calls is what a simple question costs in our reports.\n", 1, 3)
    quotes = [q for _, q in item_quotes(item, "How many calls does a simple question cost?")]
    assert "LLM Usage Stats: 3 calls is what a simple question costs in our reports." in quotes
