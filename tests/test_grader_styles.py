"""KB_AGENT_GRADER styles, grades read from token probabilities, and grades that carry no
information (SPEC §2 "A grade must carry information"; §7 "An answer the evidence does not hold")."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from crag import Agent, grading
from crag.config import Settings
from crag.errors import ConfigError
from crag.llm.scripted import ScriptedChatModel
from crag.nodes import NodeConfig, grade_evidence
from crag.ports import GradeTask, LLMRequest, LLMRequests
from crag.prompts import grades, read_grades, render
from crag.state import AgentState, Completion, GraderAction, TokenLogprob, ToolCall, ToolRun
from crag.tools import builtin

from .fakes import FakeToolbox, item, route, scores, search_plan

QUESTION = "Where is the upload retry policy configured?"


def label_tokens(*p_yes: float) -> tuple[TokenLogprob, ...]:
    """The tokens of a reply ``1: yes`` / ``2: no`` ... whose label token at item k has P(yes) = p_yes[k]."""
    out = []
    for k, p in enumerate(p_yes, 1):
        if k > 1:
            out.append(TokenLogprob("\n", 0.0))
        word = " yes" if p >= 0.5 else " no"
        top = ((" yes", math.log(max(p, 1e-9))), (" no", math.log(max(1 - p, 1e-9))))
        top = tuple(sorted(top, key=lambda t: -t[1]))
        out += [TokenLogprob(str(k), 0.0), TokenLogprob(":", 0.0), TokenLogprob(word, max(top[0][1], -50.0), top)]
    return tuple(out)


def label_reply(*p_yes: float, logprobs: bool = True) -> Completion:
    tokens = label_tokens(*p_yes)
    return Completion("".join(t.token for t in tokens), "m", prompt_tokens=100, completion_tokens=len(tokens),
                      logprobs=tokens if logprobs else None)


# -- reading a reply -----------------------------------------------------------------------


def test_label_lines_are_read_from_their_token_probabilities():
    reading = read_grades(label_reply(0.9, 0.2, 0.55).text, 3, label_reply(0.9, 0.2, 0.55).logprobs)
    assert reading.from_logprobs
    assert reading.scores == pytest.approx((0.9, 0.2, 0.55), abs=1e-3)
    assert reading.tosses == 1  # 0.55 is a coin toss


@pytest.mark.parametrize("parts", [("\ufffd", "\ufffd"), ("bytes:\\xc3", "bytes:\\xa9")])
@pytest.mark.parametrize("where", ["after", "before"])
def test_a_character_sent_as_tokens_of_its_bytes_leaves_the_labels_probabilities_read(parts, where):
    """An "é" sent as two tokens of one byte each (llama.cpp's "\ufffd", OpenAI's "bytes:\\xc3")
    matches no character of the text: every item's probability was thrown away for the text's
    1.0 / 0.0 labels, whatever line the character was on."""
    labels = label_tokens(0.9, 0.2, 0.55)
    note = (TokenLogprob("Note", 0.0), TokenLogprob(": caf", 0.0), TokenLogprob(parts[0], 0.0),
            TokenLogprob(parts[1], 0.0))
    tokens = (*labels, TokenLogprob("\n", 0.0), *note) if where == "after" else (*note, TokenLogprob("\n", 0.0), *labels)
    body = "".join(t.token for t in labels)
    text = f"{body}\nNote: café" if where == "after" else f"Note: café\n{body}"
    reading = read_grades(text, 3, tokens)
    assert reading.from_logprobs and reading.scores == pytest.approx((0.9, 0.2, 0.55), abs=1e-3)


def test_an_escape_the_reply_writes_out_leaves_the_labels_probabilities_read():
    """A reply quoting "\\x1b" (a backslash, x, 1, b, written over several tokens) had it taken
    out of its text but not out of its tokens, which then lined up with nothing."""
    labels = label_tokens(0.8, 0.3)
    quote = (TokenLogprob("Passage 2 quotes", 0.0), TokenLogprob(" \\", 0.0), TokenLogprob("x", 0.0),
             TokenLogprob("1b", 0.0), TokenLogprob(" for ESC.", 0.0), TokenLogprob("\n", 0.0))
    text = "Passage 2 quotes \\x1b for ESC.\n" + "".join(t.token for t in labels)
    reading = read_grades(text, 2, (*quote, *labels))
    assert reading.from_logprobs and reading.scores == pytest.approx((0.8, 0.3), abs=1e-3)


def test_a_label_word_among_the_separators_alternatives_is_not_read_as_the_label():
    """llama.cpp's ``:`` after ``2`` listed `` yes`` at -9.9: the label is the next token."""
    tokens = (TokenLogprob("1", 0.0), TokenLogprob(":", 0.0, ((":", 0.0), (" no", -11.0))),
              TokenLogprob(" no", -0.24, ((" no", -0.24), (" yes", -1.86))), TokenLogprob("\n", 0.0),
              TokenLogprob("2", -0.06), TokenLogprob(":", 0.0, ((":", 0.0), (" yes", -9.86))),
              TokenLogprob(" yes", -0.21, ((" yes", -0.21), (" no", -1.68))))
    reading = read_grades("1: no\n2: yes", 2, tokens)
    p1 = math.exp(-1.86) / (math.exp(-1.86) + math.exp(-0.24))
    p2 = math.exp(-0.21) / (math.exp(-0.21) + math.exp(-1.68))
    assert reading.scores == pytest.approx((p1, p2), abs=1e-3)


def test_label_lines_without_probabilities_are_read_from_the_text():
    reading = read_grades("1: yes\n2: no\n3: Yes.", 3)
    assert reading.scores == (1.0, 0.0, 1.0) and not reading.from_logprobs


@pytest.mark.parametrize("text", ["[1] yes\n[2] no", "1. yes\n2. no", "Passage 1: yes\nPassage 2: no", "1 - yes\n2 - no",
                                  "**1**: yes\n**2**: no", "**Passage 1**: yes\n**Passage 2**: no"])  # Markdown bold numbers
def test_label_lines_in_the_shapes_small_models_write(text):
    assert read_grades(text, 2).scores == (1.0, 0.0)


def test_the_seed_reply_of_n_numbers_still_reads():
    assert read_grades("[0.9, 0.1, 0.5]", 3).scores == (0.9, 0.1, 0.5)
    assert read_grades('{"scores": [1, 0]}', 2).scores == (1.0, 0.0)


@pytest.mark.parametrize("text", ["1: yes", "1: yes\n2: maybe\n3: no", "", "yes no yes"])
def test_a_reply_without_a_label_for_every_item_is_a_parse_failure(text):
    assert read_grades(text, 3) is None


def test_a_pointwise_reply_is_one_bare_label():
    tokens = (TokenLogprob("Yes", math.log(0.7), (("Yes", math.log(0.7)), ("No", math.log(0.3)))),)
    reading = read_grades("Yes", 1, tokens)
    assert reading.scores == pytest.approx((0.7,), abs=1e-3) and reading.from_logprobs


def test_runaway_label_lines_are_read_with_work_linear_in_their_tokens(monkeypatch):
    """A server that ignored the budget sent 6,000 ``K: yes`` lines (24,000 tokens) with their
    probabilities: the tokens are lined up with the text once, and each item's label token is
    read once (its first line), not every line again."""
    read = []
    monkeypatch.setattr(grades, "p_label", lambda choice, _p=grades.p_label: read.append(choice) or _p(choice))
    n, lines = 12, 6_000
    one = label_tokens(*[0.9] * n)
    tokens = (*one, TokenLogprob("\n", 0.0)) * (lines // n)
    text = "".join(t.token for t in tokens)
    reading = read_grades(text, n, tokens)
    assert reading.from_logprobs and reading.scores == pytest.approx((0.9,) * n, abs=1e-3)
    assert len(read) == n


@given(st.text(max_size=300), st.integers(1, 12))
def test_any_reply_reads_into_n_scores_in_range_or_none(text, n):
    reading = read_grades(text, n)
    assert reading is None or (len(reading.scores) == n and all(0.0 <= s <= 1.0 for s in reading.scores))


# -- uninformative grades ------------------------------------------------------------------


def test_the_same_score_for_several_items_carries_no_information():
    assert grading.uninformative((0.0,) * 5) == "same_score"
    assert grading.uninformative((0.5,) * 10) == "same_score"
    assert grading.uninformative((0.1, 0.1, 0.1)) is None  # three alike is a plausible verdict (seed 001)
    assert grading.uninformative((0.0, 0.0, 0.0, 0.9)) is None
    assert grading.uninformative((0.0,) * 5, sure=5) is None  # sure of every "no": that is a verdict
    assert grading.uninformative((0.0,) * 5, sure=4) == "same_score"


def test_coin_tosses_carry_no_information():
    assert grading.uninformative((0.5, 0.45, 0.6), tosses=3) == "coin_toss"
    assert grading.uninformative((0.5, 0.95, 0.6), tosses=2) is None


def _run(replies, results, settings=None):
    model = ScriptedChatModel(replies)
    toolbox = FakeToolbox(results, question=QUESTION)
    return Agent(model, toolbox, settings or Settings()).ask(QUESTION), model


def test_an_uninformative_grade_removes_nothing_and_forces_no_round():
    five = [item(k, score=0.5) for k in range(1, 6)]
    result, model = _run(
        {"analyze_and_route": [route("complex")], "plan": [search_plan()],
         "grade_evidence": [label_reply(0.45, 0.5, 0.55, 0.4, 0.6)],
         "synthesize": ["Evidence number 1 about the retry policy [1]."]},
        {"vector_search": [five]},
    )
    audit = result.audit
    assert [e["reason"] for e in audit if e["event"] == "grader_uninformative"] == ["coin_toss"]
    assert not [e for e in audit if e["event"] == "evidence_removed"]
    assert model.calls("grade_evidence") == 1 and result.iterations == 1  # no second round
    assert result.state.grader_action.value == "GENERATE"  # the planned search found them (the question's words)
    assert len(result.state.context) == 5
    assert result.state.evidence_scores == (grading.UNGRADED_SCORE,) * 5
    assert "was not graded" in result.answer


def test_without_the_questions_own_hits_an_uninformative_grade_refines_by_retrieval():
    ctx = [item(k, score=0.1) for k in range(1, 5)]
    state = AgentState(QUESTION, context=tuple(ctx), iteration=1,
                       tool_history=(ToolRun(1, ToolCall("vector_search", {"query": "other words"}), tuple(ctx)),))
    tools = builtin("vector_search")
    assert grading.retrieval_action(state.context, state.tool_history, QUESTION, 0.3, tools).value == "REFINE"
    own = (ToolRun(1, ToolCall("vector_search", {"query": QUESTION}), tuple(ctx[:1])),)
    assert grading.retrieval_action(state.context, own, QUESTION, 0.3, tools).value == "GENERATE"


def test_a_grade_read_from_probabilities_filters_as_the_seed_says():
    five = [item(k, score=0.5) for k in range(1, 6)]
    result, model = _run(
        {"analyze_and_route": [route("complex")], "plan": [search_plan()],
         "grade_evidence": [label_reply(0.95, 0.1, 0.85, 0.2, 0.9)],
         "synthesize": ["Evidence number 1 about the retry policy [1]."]},
        {"vector_search": [five]},
    )
    request = model.requests[[r.node for r in model.requests].index("grade_evidence")]
    assert request.logprobs > 0 and request.reply_schema is None
    assert request.max_tokens == 16 + 8 * 5
    assert result.state.evidence_scores == pytest.approx((0.95, 0.85, 0.9), abs=1e-3)
    assert [e["source"] for e in result.audit if e["event"] == "evidence_removed"] == [five[1].label, five[3].label]
    assert result.state.grader_action.value == "GENERATE"
    assert result.state.graded_by == "grader"


def test_the_pointwise_grader_asks_once_per_item():
    four = [item(k, score=0.5) for k in range(1, 5)]
    yes = Completion("yes", "m", logprobs=(TokenLogprob("yes", math.log(0.9), (("yes", math.log(0.9)), ("no", math.log(0.1)))),))
    no = Completion("no", "m", logprobs=(TokenLogprob("no", math.log(0.8), (("no", math.log(0.8)), ("yes", math.log(0.2)))),))
    result, model = _run(
        {"analyze_and_route": [route("complex")], "plan": [search_plan()],
         "grade_evidence": [yes, no, yes, no], "synthesize": ["Evidence number 1 about the retry policy [1]."]},
        {"vector_search": [four]},
        Settings(grader="pointwise"),
    )
    assert model.calls("grade_evidence") == 4
    assert all(len(r.task.items) == 1 for r in model.requests if r.node == "grade_evidence")
    assert result.state.evidence_scores == pytest.approx((0.9, 0.9), abs=1e-3)
    assert result.usage.by_node["grade_evidence"].calls == 4


def test_pointwise_prepare_is_one_request_per_item():
    ctx = tuple(item(k) for k in range(1, 4))
    state = AgentState(QUESTION, context=ctx, iteration=1)
    request = grade_evidence.prepare(state, NodeConfig(Settings(auto_approve_max_items=0, grader="pointwise"))).request
    assert isinstance(request, LLMRequests) and len(request.requests) == 3
    assert all(isinstance(r, LLMRequest) and r.max_tokens == 24 for r in request.requests)


def test_the_scores_style_is_the_first_prompt_with_structured_output():
    ctx = tuple(item(k) for k in range(1, 4))
    state = AgentState(QUESTION, context=ctx, iteration=1)
    request = grade_evidence.prepare(state, NodeConfig(Settings(auto_approve_max_items=0, grader="scores"))).request
    assert request.reply_schema is not None and request.logprobs == 0
    assert '{"scores"' in request.messages[0]["content"]


def test_the_batch_prompt_gives_no_example_and_restates_the_question():
    messages = render(GradeTask(QUESTION, tuple(item(k) for k in range(1, 4))))
    user = messages[1]["content"]
    assert user.count(QUESTION) == 2
    assert user.rstrip().endswith("then yes or no.")
    assert "0.5" not in messages[0]["content"] + user


def test_the_grader_setting_is_validated():
    assert Settings.from_env({"KB_AGENT_GRADER": "pointwise"}, dotenv=None).grader == "pointwise"
    assert Settings.from_env({}, dotenv=None).grader == "batch"
    with pytest.raises(ConfigError, match="KB_AGENT_GRADER"):
        Settings.from_env({"KB_AGENT_GRADER": "sometimes"}, dotenv=None)


def test_the_offline_backends_grade_is_never_called_uninformative():
    from crag.llm.offline import OfflineChatModel

    state = AgentState(QUESTION, context=tuple(item(k, text="Nothing to see here at all.") for k in range(1, 6)),
                       iteration=1)
    cfg = NodeConfig(Settings(auto_approve_max_items=0))
    step = grade_evidence.prepare(state, cfg)
    reply = OfflineChatModel().complete(step.request)
    after = grade_evidence.apply(state, step, reply, cfg)
    assert not [e for e in after.audit if e.event == "grader_uninformative"]
    assert after.grader_action.value == "RE_RETRIEVE"


# -- the verdict on the simple path ----------------------------------------------------------


def test_a_simple_answer_the_evidence_does_not_hold_says_so():
    evidence = [item(1, text="Uploads are retried three times by the upload worker.")]
    result, _ = _run(
        {"analyze_and_route": [route("simple")], "plan": [search_plan()],
         "synthesize": ["Uploads are retried three times [1]. Set RETRY_BACKOFF_SECONDS in settings.toml to "
                        "change the delay [1]. The dashboard shows each retry in red [1]."]},
        {"vector_search": [evidence]},
    )
    body = result.to_dict()
    assert body["grounding"]["verdict"] == "not_answered"
    assert result.answer.startswith("The knowledge base does not appear to answer this question")
    assert "Uploads are retried three times [1]." in result.answer
    assert "RETRY_BACKOFF_SECONDS" not in result.answer and "dashboard" not in result.answer


def test_a_simple_answer_with_no_supported_sentence_is_the_no_evidence_sentence():
    from crag.answer import NO_EVIDENCE

    result, _ = _run(
        {"analyze_and_route": [route("simple")], "plan": [search_plan()],
         "synthesize": ["Set RETRY_BACKOFF_SECONDS in settings.toml [1]. The dashboard shows retries [1]."]},
        {"vector_search": [[item(1, text="Uploads are retried three times by the upload worker.")]]},
    )
    assert result.answer.startswith(NO_EVIDENCE)
    assert result.to_dict()["grounding"]["verdict"] == "not_answered"
    assert not result.citations


def test_a_supported_simple_answer_is_answered():
    result, _ = _run(
        {"analyze_and_route": [route("simple")], "plan": [search_plan()],
         "synthesize": ["Uploads are retried three times by the upload worker [1]."]},
        {"vector_search": [[item(1, text="Uploads are retried three times by the upload worker.")]]},
    )
    assert result.to_dict()["grounding"]["verdict"] == "answered"
    assert not result.answer.startswith("The knowledge base does not appear")


# -- items the grader could not decide, replies that copy one label ---------------------------


def test_one_label_for_every_item_without_being_sure_carries_no_information():
    unsure = read_grades("1: no\n2: no\n3: no\n4: no", 4, label_tokens(0.2, 0.35, 0.15, 0.4))
    assert grading.uninformative(unsure.scores, unsure.tosses, unsure.labels, unsure.sure) == "same_label"
    sure = read_grades("1: no\n2: no\n3: no\n4: no", 4, label_tokens(0.02, 0.05, 0.01, 0.08))
    assert grading.uninformative(sure.scores, sure.tosses, sure.labels, sure.sure) is None  # a sure "no" to all
    mixed = read_grades("1: no\n2: yes\n3: no\n4: no", 4, label_tokens(0.2, 0.75, 0.15, 0.4))
    assert grading.uninformative(mixed.scores, mixed.tosses, mixed.labels, mixed.sure) is None
    three = read_grades("1: no\n2: no\n3: no", 3, label_tokens(0.2, 0.35, 0.15))
    assert grading.uninformative(three.scores, three.tosses, three.labels, three.sure) is None  # seed 001: three alike


def test_probabilities_between_the_thresholds_are_kept_and_do_not_choose_the_action():
    # 0.2 is below the drop threshold; 0.45 and 0.6 are undecided; 0.8 is a yes
    decision = grading.decide((0.2, 0.45, 0.6, 0.8), 0.3, 0.7, GraderAction.REFINE)
    assert decision.removed == (0,) and decision.kept == (1, 2, 3)
    assert decision.action.value == "GENERATE"  # the mean of the decided kept items: 0.8
    nothing_decided = grading.decide((0.2, 0.45, 0.6), 0.3, 0.7, GraderAction.GENERATE)
    assert nothing_decided.kept == (1, 2) and nothing_decided.action.value == "GENERATE"  # from retrieval
    assert grading.decide((0.2, 0.45, 0.6), 0.3, 0.7).action.value == "REFINE"  # a number reply: the seed's mean


def test_a_mid_range_probability_grade_answers_in_one_round():
    five = [item(k, score=0.5) for k in range(1, 6)]
    result, model = _run(
        {"analyze_and_route": [route("complex")], "plan": [search_plan()],
         "grade_evidence": [label_reply(0.62, 0.1, 0.55, 0.4, 0.58)],
         "synthesize": ["Evidence number 1 about the retry policy [1]."]},
        {"vector_search": [five]},
    )
    assert model.calls("grade_evidence") == 1 and result.iterations == 1
    assert result.state.grader_action.value == "GENERATE"  # the question's own search found them
    assert [e["source"] for e in result.audit if e["event"] == "evidence_removed"] == [five[1].label]
    assert [e["items"] for e in result.audit if e["event"] == "grades_undecided"] == [4]


def test_a_grading_prompt_quotes_each_items_best_excerpt():
    filler = "\n".join(f"unrelated line {k} about colours and shapes" for k in range(60))
    text = filler + "\nThe upload retry policy is configured in retry.toml.\n" + filler
    task = GradeTask(QUESTION, (item(1, text=text),))
    prompt = render(task)[1]["content"]
    assert "> The upload retry policy is configured in retry.toml." in prompt
    assert len(prompt) < len(text) // 3
    assert render(GradeTask(QUESTION, (item(1, text="short text"),)))[1]["content"].count("short text") == 1


# -- what the question names -------------------------------------------------------------------


@pytest.mark.parametrize("question, terms", [
    ("How do I serve my FastAPI application over HTTP/3?", ["FastAPI", "HTTP/3"]),
    ("How do I run a model from the Hub on an Apple Watch?", ["Hub", "Apple Watch"]),
    ("How do I expose my endpoints as gRPC services?", ["gRPC"]),
    ("Which libraries serve a GraphQL API?", ["GraphQL", "API"]),
    ("I use Flask. Then how do I render templates?", ["Flask"]),
    ("how do uploads retry after a failure?", []),
    ("What did Ångström measure in Zürich with C++?", ["Ångström", "Zürich", "C++"]),  # whole, accents and all
])
def test_the_terms_a_question_names(question, terms):
    from crag.grounding import named

    assert named(question) == terms


def test_a_term_no_evidence_holds_makes_the_answer_not_answered_whatever_the_grade():
    from crag.grounding import missing

    assert missing("How do I serve it over HTTP/3?", ["HTTP/2 is supported", "the server"]) == ["HTTP/3"]
    assert missing("Where is Hugging Face?", ["huggingface.co hosts it"]) == []
    assert missing("Who was Ångström?", ["Anders Angstrom measured light"]) == []  # accents folded
    assert missing("Who was Ångström?", ["Anders Celsius measured heat"]) == ["Ångström"]  # not "ngstr"
    evidence = [item(k, text=f"Uploads are retried three times by the upload worker, note {k}.") for k in range(1, 6)]
    result, _ = _run(
        {"analyze_and_route": [route("complex")], "plan": [search_plan()],
         "grade_evidence": [scores(0.9, 0.9, 0.9, 0.9, 0.8)],
         "synthesize": ["Uploads are retried three times by the upload worker [1]."]},
        {"vector_search": [evidence]},
    )
    assert result.to_dict()["grounding"]["verdict"] == "answered"
    question = "How are uploads retried when sent through Kafka?"
    model = ScriptedChatModel({"analyze_and_route": [route("complex")], "plan": [search_plan()],
                               "grade_evidence": [scores(0.9, 0.9, 0.9, 0.9, 0.8)],
                               "synthesize": ["Uploads are retried three times by the upload worker [1]."]})
    kafka = Agent(model, FakeToolbox({"vector_search": [evidence]}, question=question), Settings()).ask(question)
    assert kafka.to_dict()["grounding"]["verdict"] == "not_answered"
    assert kafka.answer.startswith("The knowledge base does not appear to answer this question: none of the "
                                   "documents found mentions Kafka")
    assert "\n\nUploads are retried three times by the upload worker [1]" in kafka.answer  # what they support
    assert [e["terms"] for e in kafka.audit if e["event"] == "question_terms_missing"] == [["Kafka"]]


def test_the_first_item_of_a_batch_is_removed_only_on_a_sure_no():
    five = [item(k, score=0.5) for k in range(1, 6)]
    replies = {"analyze_and_route": [route("complex")], "plan": [search_plan()],
               "synthesize": ["Evidence number 1 about the retry policy [1]."]}
    # a small model's first label is "no" whatever the passage: below the drop threshold, not sure
    result, _ = _run({**replies, "grade_evidence": [label_reply(0.2, 0.1, 0.85, 0.2, 0.9)]}, {"vector_search": [five]})
    assert [e["source"] for e in result.audit if e["event"] == "first_label_spared"] == [five[0].label]
    assert [e["source"] for e in result.audit if e["event"] == "evidence_removed"] == [five[1].label, five[3].label]
    assert result.state.context[0] == five[0] and result.state.grader_action.value == "GENERATE"
    # a sure "no" removes it; so does a number reply (the seed's protocol)
    sure, _ = _run({**replies, "grade_evidence": [label_reply(0.05, 0.1, 0.85, 0.2, 0.9)]}, {"vector_search": [five]})
    assert five[0].label in [e["source"] for e in sure.audit if e["event"] == "evidence_removed"]
    numbers, _ = _run({**replies, "grade_evidence": [scores(0.2, 0.1, 0.85, 0.2, 0.9)]}, {"vector_search": [five]})
    assert five[0].label in [e["source"] for e in numbers.audit if e["event"] == "evidence_removed"]


def test_with_a_drop_threshold_above_half_no_item_stays_in_context_below_it():
    """KB_AGENT_DROP_THRESHOLD above 0.5 (the ungraded score): the items an uninformative reading
    keeps stay at the drop threshold, not at 0.5, and a batch's first label read below it is not
    spared, since as ungraded it would stay below it (seed 000's filter, at the user's threshold)."""
    five = [item(k, score=0.5) for k in range(1, 6)]
    replies = {"analyze_and_route": [route("complex")], "plan": [search_plan()],
               "synthesize": ["Evidence number 1 about the retry policy [1]."]}
    raised = Settings(drop_threshold=0.6, max_iterations=1)
    coin, _ = _run({**replies, "grade_evidence": [label_reply(0.45, 0.5, 0.55, 0.4, 0.6)]},
                   {"vector_search": [five]}, raised)
    assert [e["reason"] for e in coin.audit if e["event"] == "grader_uninformative"] == ["coin_toss"]
    assert coin.state.context == tuple(five) and coin.state.evidence_scores == (0.6,) * 5
    first, _ = _run({**replies, "grade_evidence": [label_reply(0.2, 0.1, 0.85, 0.2, 0.9)]},
                    {"vector_search": [five]}, raised)
    assert not [e for e in first.audit if e["event"] == "first_label_spared"]
    assert [e["source"] for e in first.audit if e["event"] == "evidence_removed"] == [five[0].label, five[1].label,
                                                                                     five[3].label]
    assert first.state.context == (five[2], five[4]) and min(first.state.evidence_scores) >= 0.6


def test_a_term_no_item_holds_sends_the_first_round_back_to_search_once():
    """The ``named_terms`` rule: grades read from token probabilities approve evidence that
    never mentions Kafka; the first round refines (rule ``term_missing``), a second round
    that still lacks it is decided by the grades. A reply of numbers and the ``seed`` policy
    are the seeds' rule: one round."""
    question = "How are uploads retried when sent through Kafka?"
    evidence = [item(k, text=f"Uploads are retried three times by the upload worker, note {k}.") for k in range(1, 6)]

    def ask(grades, settings=None):
        model = ScriptedChatModel({"analyze_and_route": [route("complex")],
                                   "plan": [search_plan(), search_plan("uploads Kafka")],
                                   "grade_evidence": list(grades),
                                   "synthesize": ["Uploads are retried three times by the upload worker [1]."]})
        toolbox = FakeToolbox({"vector_search": [evidence, evidence]}, question=question)
        return Agent(model, toolbox, settings or Settings()).ask(question), model

    sure = label_reply(0.95, 0.9, 0.92, 0.9, 0.97)
    result, model = ask([sure, sure])
    decided = [(e["rule"], e["action"]) for e in result.audit if e["event"] == "grade_decided"]
    assert decided == [("term_missing", "REFINE"), ("mean_high", "GENERATE")]
    assert model.calls("plan") == 2 and result.iterations == 2
    assert next(e["terms"] for e in result.audit if e["event"] == "question_terms_missing") == ["Kafka"]
    assert result.to_dict()["grounding"]["verdict"] == "not_answered"  # still not mentioned: said so

    numbers, model = ask([scores(0.9, 0.9, 0.9, 0.9, 0.8)])
    assert model.calls("plan") == 1 and numbers.iterations == 1
    seed, model = ask([sure], Settings(grading_policy="seed"))
    assert model.calls("plan") == 1 and seed.iterations == 1


def test_a_term_held_only_by_an_item_the_grades_remove_sends_the_round_back_to_search():
    """The term is asked of the items the grades keep: an answer from them would say none
    mentions it, so the first round searches again."""
    question = "How are uploads retried when sent through Kafka?"
    evidence = [item(k, text=f"Uploads are retried three times by the upload worker, note {k}.") for k in range(1, 5)]
    evidence.append(item(5, text="Kafka topics are listed in the broker settings."))
    model = ScriptedChatModel({"analyze_and_route": [route("complex")],
                               "plan": [search_plan(), search_plan("uploads Kafka")],
                               "grade_evidence": [label_reply(0.95, 0.9, 0.92, 0.9, 0.02),
                                                  label_reply(0.95, 0.9, 0.92, 0.9)],  # the four kept
                               "synthesize": ["Uploads are retried three times by the upload worker [1]."]})
    toolbox = FakeToolbox({"vector_search": [evidence, evidence]}, question=question)
    result = Agent(model, toolbox, Settings()).ask(question)
    decided = [e["rule"] for e in result.audit if e["event"] == "grade_decided"]
    assert decided == ["term_missing", "mean_high"]
    assert next(e["terms"] for e in result.audit if e["event"] == "question_terms_missing") == ["Kafka"]


def test_a_null_logprob_on_a_separator_leaves_the_labels_probabilities_read():
    """llama.cpp writes a -inf logprob as ``null``: the reply's grades were read from its text
    (1.0 / 0.0) instead of from the label tokens, which carried theirs."""
    from crag.llm.logprobs import read_logprobs

    def line(k, word, p):
        top = [{"token": " yes", "logprob": math.log(p)}, {"token": " no", "logprob": math.log(1 - p)}]
        return [{"token": str(k), "logprob": 0.0}, {"token": ":", "logprob": None},
                {"token": word, "logprob": math.log(max(p, 1 - p)), "top_logprobs": top}]

    tokens = read_logprobs({"content": [*line(1, " yes", 0.8), {"token": "\n", "logprob": 1e-7},
                                        *line(2, " no", 0.3)]})
    reading = read_grades("1: yes\n2: no", 2, tokens)
    assert reading.from_logprobs and reading.scores == pytest.approx((0.8, 0.3), abs=1e-3)


@pytest.mark.parametrize("top", [(), ((" no", math.log(0.53)),)])
def test_a_label_token_without_alternatives_is_read_from_its_own_probability(top):
    """llama.cpp sends no ``top_logprobs`` on some tokens, and a server may honour ``logprobs``
    but not ``top_logprobs``: a ``no`` at P 0.53 was read as a sure 0.0 and its item removed."""
    tokens = (TokenLogprob("1", 0.0), TokenLogprob(":", 0.0), TokenLogprob(" no", math.log(0.53), top),
              TokenLogprob("\n", 0.0), TokenLogprob("2", 0.0), TokenLogprob(":", 0.0),
              TokenLogprob(" yes", math.log(0.9), ()))
    reading = read_grades("1: no\n2: yes", 2, tokens)
    assert reading.from_logprobs and reading.scores == pytest.approx((0.47, 0.9), abs=1e-3)
    unknown = (TokenLogprob("yes", float("-inf")),)  # a null logprob, no alternatives: no probability
    assert read_grades("yes", 1, unknown).scores == (1.0,) and not read_grades("yes", 1, unknown).from_logprobs


def test_a_label_token_missing_from_its_alternatives_is_not_read_as_the_other_label():
    """A ``yes`` whose own probability is not among its alternatives (it is listed as ``null`` or
    NaN, or not at all) was read from the ``no`` alone: a sure 0.0 against the label written,
    and its item removed."""
    from crag.llm.logprobs import read_logprobs

    def reply(own, top):
        return read_logprobs({"content": [{"token": "1", "logprob": 0.0}, {"token": ":", "logprob": 0.0},
                                          {"token": " yes", "logprob": own, "top_logprobs": top}]})

    no = {"token": " no", "logprob": math.log(0.35)}
    unknown = [reply(None, [{"token": " yes", "logprob": None}, no]), reply(float("nan"), [no]),
               reply(None, [no])]
    for tokens in unknown:  # no probability for the label written: read from the text
        reading = read_grades("1: yes", 1, tokens)
        assert reading.scores == (1.0,) and not reading.from_logprobs
    unlisted = reply(math.log(0.4), [no, {"token": " No", "logprob": math.log(0.2)}])  # yes counted with its own
    assert read_grades("1: yes", 1, unlisted).scores == pytest.approx((0.4 / 0.95,), abs=1e-3)
    spelt = reply(math.log(0.55), [{"token": "yes", "logprob": math.log(0.55)}, no])  # its word listed: once
    assert read_grades("1: yes", 1, spelt).scores == pytest.approx((0.55 / 0.9,), abs=1e-3)


def test_an_alternative_listed_twice_is_counted_once():
    """vLLM lists the sampled token among ``top_logprobs`` again: P(yes) 0.5 was read as 0.67."""
    half = math.log(0.5)
    tokens = (TokenLogprob("1", 0.0), TokenLogprob(":", 0.0),
              TokenLogprob(" yes", half, ((" yes", half), (" yes", half), (" no", half), ("Yes", math.log(0.1)))))
    assert read_grades("1: yes", 1, tokens).scores == pytest.approx(((0.5 + 0.1) / 1.1,), abs=1e-3)


def reasoning_reply(think_p_yes, p_yes) -> Completion:
    """A reply from a server with a reasoning parser (vLLM, llama.cpp ``--reasoning-format``): the
    text holds the answer only, its logprobs every generated token, the thinking first."""
    think = (TokenLogprob("<think>", 0.0), TokenLogprob("\n", 0.0), TokenLogprob("Passage", 0.0),
             TokenLogprob(" ", 0.0), *label_tokens(*think_p_yes), TokenLogprob("\n", 0.0),
             TokenLogprob("</think>", 0.0), TokenLogprob("\n\n", 0.0))
    answer = label_tokens(*p_yes)
    return Completion("".join(t.token for t in answer), "m", prompt_tokens=100, completion_tokens=40,
                      logprobs=(*think, *answer))


def test_the_thinking_in_the_logprobs_is_not_read_as_the_grades():
    """The thinking said ``Passage 1: yes`` ..., the answer ``1: no`` ... ``5: no``: every item
    was read at the thinking's tokens, P(yes) ~0.95, against every label written."""
    reply = reasoning_reply([0.95, 0.9, 0.92, 0.97, 0.91], [0.2, 0.1, 0.15, 0.05, 0.25])
    assert reply.text.startswith("1: no")
    reading = read_grades(reply.text, 5, reply.logprobs)
    assert reading.from_logprobs and not reading.unaligned
    assert reading.scores == pytest.approx((0.2, 0.1, 0.15, 0.05, 0.25), abs=1e-3)


def test_logprobs_that_do_not_line_up_with_the_text_are_not_read_and_the_audit_says_so():
    five = [item(k, score=0.5) for k in range(1, 6)]
    other = label_reply(0.9, 0.9, 0.9, 0.9, 0.9)  # its tokens say yes five times; the text says otherwise
    reply = Completion("1: yes\n2: no\n3: yes\n4: no\n5: yes", "m", prompt_tokens=100, completion_tokens=20,
                       logprobs=other.logprobs)
    reading = read_grades(reply.text, 5, reply.logprobs)
    assert reading.unaligned and not reading.from_logprobs and reading.scores == (1.0, 0.0, 1.0, 0.0, 1.0)
    result, _ = _run({"analyze_and_route": [route("complex")], "plan": [search_plan()], "grade_evidence": [reply],
                      "synthesize": ["Evidence number 1 about the retry policy [1]."]}, {"vector_search": [five]})
    unaligned = [e for e in result.audit if e["event"] == "logprobs_unaligned"]
    assert unaligned == [{"event": "logprobs_unaligned", "level": "warning", "node": "grade_evidence", "items": 5}]
    assert [e["score"] for e in result.audit if e["event"] == "evidence_removed"] == [0.0, 0.0]


def test_tokens_for_the_start_of_the_text_only_are_read_where_they_reach():
    tokens = label_tokens(0.8, 0.3, 0.9)[:3]  # "1: yes" alone: the server's list stopped there
    reading = read_grades("1: yes\n2: no\n3: yes", 3, tokens)
    assert not reading.unaligned and not reading.from_logprobs
    assert reading.scores == pytest.approx((0.8, 0.0, 1.0), abs=1e-3)


@pytest.mark.parametrize("think", ["<think>\n\n</think>\n\n", "<think>\nPassage 1 answers it: yes.\n</think>\n"])
def test_the_probabilities_after_a_think_block_are_read(think):
    """Any think block, even an empty one, made the reader drop every token probability: P(yes)
    0.2 ... 0.25 became five sure ``no`` and five removals, where the same reply without it is
    an uninformative ``same_label`` reading."""
    answer = label_tokens(0.2, 0.1, 0.15, 0.05, 0.25)
    tokens = (TokenLogprob(think, -0.01), *answer)
    reading = read_grades(think + "".join(t.token for t in answer), 5, tokens)
    assert reading.from_logprobs and reading.scores == pytest.approx((0.2, 0.1, 0.15, 0.05, 0.25), abs=1e-3)
    assert grading.uninformative(reading.scores, reading.tosses, reading.labels, reading.sure) == "same_label"


def test_one_label_for_every_item_of_a_pointwise_grading_is_n_verdicts_not_a_copied_one():
    """``same_label`` catches a label copied down a batch's list; separate requests have none to
    copy (docs/real-models.md: pointwise said ``yes`` to every item, P 0.72-0.93, and ranked them
    best, AUC 0.74). Coin tosses are caught in both."""
    def one(p):
        top = (("yes", math.log(p)), ("no", math.log(1 - p)))
        word = "yes" if p >= 0.5 else "no"
        return Completion(word, "m", logprobs=(TokenLogprob(word, math.log(max(p, 1 - p)), top),))

    yeses = grades.read_replies(tuple(one(p) for p in (0.8, 0.75, 0.85, 0.78)), 4)
    assert yeses.from_logprobs and yeses.labels == ()
    assert grading.uninformative(yeses.scores, yeses.tosses, yeses.labels, yeses.sure) is None
    batch = read_grades("1: yes\n2: yes\n3: yes\n4: yes", 4, label_tokens(0.8, 0.75, 0.85, 0.78))
    assert grading.uninformative(batch.scores, batch.tosses, batch.labels, batch.sure) == "same_label"
    tosses = grades.read_replies(tuple(one(p) for p in (0.45, 0.55, 0.6, 0.4)), 4)
    assert grading.uninformative(tosses.scores, tosses.tosses, tosses.labels, tosses.sure) == "coin_toss"
