"""Request parameters, structured output, truncated replies and cached tokens, over real HTTP."""

from __future__ import annotations

import pytest

from crag import Agent
from crag.config import Settings
from crag.errors import ConfigError, LLMError
from crag.llm import OpenAIChatModel
from crag.ports import GradeTask, LLMRequest
from crag.schemas import grade_schema

from .fakes import FakeToolbox, item
from .openai_server import FakeOpenAIServer, NullContent, Status, Text

ROUTE = '{"complexity": "complex", "suggested_tools": ["vector_search"]}'
PLAN = '{"tool_calls": [{"tool": "vector_search", "args": {"query": "upload retry"}}]}'


@pytest.fixture
def srv():
    with FakeOpenAIServer() as server:
        yield server


def settings_for(srv: FakeOpenAIServer, **kw) -> Settings:
    return Settings(llm="openai", openai_base_url=srv.base_url, model="test-model", **kw)


def complex_run(srv: FakeOpenAIServer, **kw):
    srv.script("analyze_and_route", ROUTE)
    srv.script("plan", PLAN)
    srv.script("grade_evidence", "[0.9, 0.8, 0.9]")
    srv.script("synthesize", "Uploads retry three times [2].")
    toolbox = FakeToolbox({"vector_search": [[item(k) for k in (1, 2, 3)]]})
    settings = settings_for(srv, **kw)
    return Agent(OpenAIChatModel(settings), toolbox, settings).ask("How do uploads retry?")


def grade_request(n: int = 2) -> LLMRequest:
    return LLMRequest("grade_evidence", GradeTask("q", ()), ({"role": "user", "content": "JSON please"},),
                      max_tokens=16 + 8 * n, temperature=0.0, reply_schema=grade_schema(n))


def test_every_node_sends_its_temperature_and_reply_budget(srv):
    complex_run(srv, temperature=0.4, max_answer_tokens=700)
    route, plan, grade, synth = (srv.params(node)[0] for node in
                                 ("analyze_and_route", "plan", "grade_evidence", "synthesize"))
    assert route["temperature"] == plan["temperature"] == grade["temperature"] == 0.0
    assert synth["temperature"] == 0.4
    assert route["max_tokens"] <= 256 and plan["max_tokens"] <= 512
    assert grade["max_tokens"] == 16 + 8 * 3
    assert synth["max_tokens"] == 700


def test_json_nodes_ask_for_their_reply_schema_and_the_answer_for_none(srv):
    complex_run(srv, grader="scores")  # the label graders ask for no format (it flattens their probabilities)
    route = srv.params("analyze_and_route")[0]["response_format"]
    assert route["type"] == "json_schema"
    schema = route["json_schema"]["schema"]
    assert schema["properties"]["complexity"]["enum"] == ["chitchat", "simple", "complex"]
    grade = srv.params("grade_evidence")[0]["response_format"]["json_schema"]["schema"]
    assert grade["properties"]["scores"]["minItems"] == grade["properties"]["scores"]["maxItems"] == 3
    assert srv.params("plan")[0]["response_format"]["json_schema"]["name"] == "plan"
    assert srv.params("synthesize")[0]["response_format"] is None


def test_the_default_grader_asks_for_token_probabilities_and_no_format(srv):
    complex_run(srv)
    grade = srv.params("grade_evidence")[0]
    assert grade["response_format"] is None
    assert grade["logprobs"] is True and grade["top_logprobs"] == 5


def test_a_server_refusing_json_schema_gets_json_object_and_it_is_remembered(srv):
    srv.reject_json_schema = True
    srv.default("grade_evidence", '{"scores": [0.5, 0.5]}')
    model = OpenAIChatModel(settings_for(srv, llm_max_retries=0))  # fall-backs are not retries
    first = model.complete(grade_request())
    assert first.text == '{"scores": [0.5, 0.5]}'
    kinds = [p["response_format"]["type"] for p in srv.params()]
    assert kinds == ["json_schema", "json_object"]
    again = OpenAIChatModel(settings_for(srv, llm_max_retries=0))  # same process, same server
    again.complete(grade_request())
    assert [p["response_format"]["type"] for p in srv.params()][2:] == ["json_object"]


def test_a_server_refusing_every_format_gets_none_and_it_is_remembered(srv):
    srv.reject_response_format = True
    srv.default("grade_evidence", "[0.5, 0.5]")
    model = OpenAIChatModel(settings_for(srv, llm_max_retries=0))
    model.complete(grade_request())
    model.complete(grade_request())
    formats = [p["response_format"] for p in srv.params()]
    assert [f and f["type"] for f in formats] == ["json_schema", "json_object", None, None]


@pytest.mark.parametrize("mode, sent", [("off", None), ("json_object", "json_object"), ("json_schema", "json_schema")])
def test_the_structured_output_setting_picks_one_format(srv, mode, sent):
    srv.default("grade_evidence", "[0.5, 0.5]")
    OpenAIChatModel(settings_for(srv, structured_output=mode)).complete(grade_request())
    fmt = srv.params()[0]["response_format"]
    assert (fmt and fmt["type"]) == sent


def test_a_fixed_format_the_server_refuses_is_an_error_not_a_fallback(srv):
    srv.reject_json_schema = True
    with pytest.raises(LLMError, match="answered 400 for node grade_evidence"):
        OpenAIChatModel(settings_for(srv, structured_output="json_schema", llm_max_retries=0)).complete(
            grade_request()
        )
    assert srv.calls() == 1


@pytest.mark.parametrize("mode", ["json_schema", "json_object"])
def test_a_fixed_format_the_server_refuses_says_which_setting_to_change(srv, mode):
    srv.reject_response_format = True
    with pytest.raises(LLMError) as caught:
        OpenAIChatModel(settings_for(srv, structured_output=mode, llm_max_retries=0)).complete(grade_request())
    message = str(caught.value)
    assert f"KB_AGENT_STRUCTURED_OUTPUT={mode}" in message and "auto" in message and "\n" not in message


def test_a_server_error_during_the_fallback_is_still_retried(srv):
    srv.reject_json_schema = True
    srv.script("grade_evidence", Status(503), '{"scores": [1, 0]}')
    model = OpenAIChatModel(settings_for(srv, llm_max_retries=1))
    model.policy.backoff_base = model.policy.backoff_max = 0.01
    assert model.complete(grade_request()).text == '{"scores": [1, 0]}'


def test_a_model_refusing_max_tokens_gets_max_completion_tokens_and_it_is_remembered(srv):
    srv.reject_params = {"max_tokens"}
    srv.default("grade_evidence", '{"scores": [0.5, 0.5]}')
    model = OpenAIChatModel(settings_for(srv, llm_max_retries=0))  # not a retry
    assert model.complete(grade_request()).text == '{"scores": [0.5, 0.5]}'
    first, second = srv.params()
    assert first["max_tokens"] == 32 and first["max_completion_tokens"] is None
    assert second["max_tokens"] is None and second["max_completion_tokens"] == 32
    assert first["response_format"] == second["response_format"]  # the refusal was not taken for the format's
    OpenAIChatModel(settings_for(srv, llm_max_retries=0)).complete(grade_request())  # same process and server
    assert srv.params()[2]["max_completion_tokens"] == 32 and len(srv.params()) == 3


def test_a_model_refusing_a_temperature_gets_its_default(srv):
    srv.reject_params = {"temperature"}
    srv.default("grade_evidence", "[1, 0]")
    model = OpenAIChatModel(settings_for(srv, llm_max_retries=0))
    model.complete(grade_request())
    model.complete(grade_request())
    assert [p["temperature"] for p in srv.params()] == [0.0, None, None]
    assert [p["max_tokens"] for p in srv.params()] == [32, 32, 32]


def test_a_reasoning_model_answers_a_whole_question_streamed_or_not(srv):
    srv.reject_params = {"max_tokens", "temperature"}
    result = complex_run(srv, temperature=0.4, max_answer_tokens=700)
    assert "Uploads retry three times" in result.answer
    sent = srv.params()
    assert [p["max_completion_tokens"] for p in sent if p["max_completion_tokens"]][-1] == 700
    assert sent[-1]["temperature"] is None and sent[-1]["max_tokens"] is None
    assert len(sent) == 4 + 2  # one refusal for each parameter, then every node once
    srv.script("synthesize", "Streamed [1].")
    model = OpenAIChatModel(settings_for(srv))
    request = LLMRequest("synthesize", GradeTask("q", ()), ({"role": "user", "content": "hi"},),
                         max_tokens=99, temperature=0.2)
    deltas: list[str] = []
    assert model.complete(request, on_delta=deltas.append).text == "Streamed [1]."
    assert "".join(deltas) == "Streamed [1]." and srv.params()[-1]["max_completion_tokens"] == 99


def test_a_reply_cut_by_max_tokens_is_audited_and_still_parsed(srv):
    srv.script("analyze_and_route", Text(ROUTE, finish_reason="length"))
    srv.script("plan", PLAN)
    srv.script("grade_evidence", "[0.9, 0.8, 0.9]")
    srv.script("synthesize", Text("Evidence number 2 is about the retry policy [2]", finish_reason="length"))
    toolbox = FakeToolbox({"vector_search": [[item(k) for k in (1, 2, 3)]]})
    settings = settings_for(srv)
    result = Agent(OpenAIChatModel(settings), toolbox, settings).ask("How do uploads retry?")
    truncated = [e for e in result.state.audit if e.event == "reply_truncated"]
    assert [e.fields["node"] for e in truncated] == ["analyze_and_route", "synthesize"]
    assert truncated[0].fields["max_tokens"] <= 256
    assert result.state.routing_plan.classified  # the cut reply was parsed like any other
    assert result.answer.startswith("Evidence number 2 is about the retry policy [1]")  # grounded in item 2


def test_streamed_answers_carry_the_parameters_and_report_truncation(srv):
    srv.script("analyze_and_route", '{"complexity": "chitchat", "suggested_tools": []}')
    srv.script("synthesize", Text("Hello there", finish_reason="length"))
    settings = settings_for(srv, temperature=0.7, max_answer_tokens=99)
    result = Agent(OpenAIChatModel(settings), FakeToolbox(), settings).ask(
        "hi", on_event=lambda *_: None, stream=True
    )
    body = srv.requests[-1].body
    assert body["stream"] is True and body["temperature"] == 0.7 and body["max_tokens"] == 99
    assert any(e.event == "reply_truncated" and e.fields["node"] == "synthesize" for e in result.state.audit)


def test_implausible_server_token_counts_are_replaced_by_counted_ones_and_audited(srv):
    # A usage block once showed 3 x 10^29 completion tokens, as the server reported them.
    srv.script("analyze_and_route", '{"complexity": "chitchat", "suggested_tools": []}')
    srv.script("synthesize", Text("Hello there, how can I help?", prompt_tokens=10**12, completion_tokens=3 * 10**29))
    settings = settings_for(srv)
    result = Agent(OpenAIChatModel(settings), FakeToolbox(), settings).ask("hi")
    synth = result.usage.by_node["synthesize"]
    assert 0 < synth.completion_tokens < 20 and 0 < synth.prompt_tokens < 2000
    assert "300000000000000000000000000000" not in result.answer
    assert [e.fields["node"] for e in result.state.audit if e.event == "usage_implausible"] == ["synthesize"]
    plausible = result.usage.by_node["analyze_and_route"]
    assert plausible.completion_tokens == 4  # the server's own count (words), kept when it can be one


def test_cached_prompt_tokens_are_recorded_per_node_and_shown_when_non_zero(srv):
    srv.script("analyze_and_route", Text(ROUTE, prompt_tokens=200, cached_tokens=0))
    srv.script("plan", Text(PLAN, prompt_tokens=300, cached_tokens=128))
    srv.script("grade_evidence", Text("[0.9, 0.8, 0.9]", prompt_tokens=400, cached_tokens=256))
    srv.script("synthesize", "Uploads retry three times [2].")
    toolbox = FakeToolbox({"vector_search": [[item(k) for k in (1, 2, 3)]]})
    settings = settings_for(srv)
    result = Agent(OpenAIChatModel(settings), toolbox, settings).ask("How do uploads retry?")
    usage = result.to_dict()["usage"]
    assert usage["cached_tokens"] == 384
    assert usage["by_node"]["plan"]["cached_tokens"] == 128
    assert "cached_tokens" not in usage["by_node"]["analyze_and_route"]
    assert "384 cached" in result.answer
    assert "`plan`: 1 call, 300 prompt (128 cached)" in result.answer
    assert "`analyze_and_route`: 1 call, 200 prompt /" in result.answer


def test_no_cached_tokens_means_no_mention_in_the_usage_block(srv):
    result = complex_run(srv)
    assert "cached" not in result.answer


@pytest.mark.parametrize(
    "var, value",
    [
        ("KB_AGENT_TEMPERATURE", "hot"),
        ("KB_AGENT_TEMPERATURE", "2.5"),
        ("KB_AGENT_MAX_ANSWER_TOKENS", "0"),
        ("KB_AGENT_MAX_ANSWER_TOKENS", "lots"),
        ("KB_AGENT_CONTEXT_TOKENS", "100"),
        ("KB_AGENT_STRUCTURED_OUTPUT", "yaml"),
        ("KB_AGENT_MAX_ANSWER_TOKENS", "5000001"),  # over its ceiling (half the largest window)
    ],
)
def test_the_request_settings_are_validated(var, value):
    with pytest.raises(ConfigError) as err:
        Settings.from_env({var: value}, dotenv=None)
    assert err.value.variable == var


def test_the_request_settings_have_their_defaults():
    s = Settings.from_env({}, dotenv=None)
    assert (s.temperature, s.max_answer_tokens, s.context_tokens, s.structured_output) == (0.2, 1024, 8192, "auto")
    s = Settings.from_env({"KB_AGENT_STRUCTURED_OUTPUT": "JSON_Object", "KB_AGENT_CONTEXT_TOKENS": "32768"}, dotenv=None)
    assert (s.structured_output, s.context_tokens) == ("json_object", 32768)


# -- token probabilities (the grader's logprobs) ----------------------------------------------


def logprob_request(n: int = 2) -> LLMRequest:
    return LLMRequest("grade_evidence", GradeTask("q", ()), ({"role": "user", "content": "yes or no"},),
                      max_tokens=16 + 8 * n, temperature=0.0, logprobs=5)


LABELS = [("1", 0.0, [("1", 0.0)]), (":", 0.0, [(":", 0.0)]), (" yes", -0.2, [(" yes", -0.2), (" no", -1.7)])]


def test_logprobs_are_asked_for_and_read_from_the_reply(srv):
    srv.default("grade_evidence", Text("1: yes", logprobs=LABELS))
    reply = OpenAIChatModel(settings_for(srv)).complete(logprob_request())
    sent = srv.params()[0]
    assert sent["logprobs"] is True and sent["top_logprobs"] == 5
    assert [t.token for t in reply.logprobs] == ["1", ":", " yes"]
    assert reply.logprobs[2].top == ((" yes", -0.2), (" no", -1.7))


def test_a_reply_past_its_budget_is_read_no_further_in_its_probabilities_than_in_its_text(srv):
    """A server that ignored ``max_tokens`` sent 3,000 runaway label lines, 12,000 tokens: the
    text is cut to 16 characters per token of the budget, and its tokens where the text ends."""
    lines = 3000
    tokens = [t for _ in range(lines) for t in (*LABELS, ("\n", 0.0, [("\n", 0.0)]))]
    srv.default("grade_evidence", Text("\n".join(["1: yes"] * lines), logprobs=tokens))
    request = logprob_request(2)
    reply = OpenAIChatModel(settings_for(srv)).complete(request)
    limit = request.max_tokens * 16
    assert len(reply.text) == limit and reply.finish_reason == "length"
    assert sum(len(t.token) for t in reply.logprobs[:-1]) < limit <= sum(len(t.token) for t in reply.logprobs)


def test_only_the_grader_asks_for_logprobs(srv):
    complex_run(srv)
    assert [n for n in ("analyze_and_route", "plan", "grade_evidence", "synthesize")
            if srv.params(n)[0]["logprobs"]] == ["grade_evidence"]


def test_a_server_refusing_logprobs_is_asked_without_them_and_it_is_remembered(srv):
    srv.reject_params = {"logprobs"}
    srv.default("grade_evidence", "1: yes\n2: no")
    model = OpenAIChatModel(settings_for(srv, llm_max_retries=0))  # not a retry
    assert model.complete(logprob_request()).text == "1: yes\n2: no"
    assert [p["logprobs"] for p in srv.params()] == [True, None]
    OpenAIChatModel(settings_for(srv, llm_max_retries=0)).complete(logprob_request())
    assert [p["logprobs"] for p in srv.params()][2:] == [None]


@pytest.mark.parametrize("refusal", [
    Status(422, body={"detail": [{"type": "extra_forbidden", "loc": ["body", "logprobs"],
                                  "msg": "Extra inputs are not permitted", "input": True}]}),
    Status(422, body={"detail": "logprobs not supported"}),
    Status(400, body={"message": "logprobs is not supported by this server"}),
])
def test_a_refusal_naming_logprobs_outside_an_error_object_is_asked_without_them(srv, refusal):
    """A server (FastAPI's validation, a proxy) that names ``logprobs`` in a body without
    ``error`` was not recognised, as the SDK's message is then "Error code: 422" alone: the
    grading failed the question (exit 1) instead of being asked again without them."""
    srv.script("grade_evidence", refusal, "1: yes\n2: no")
    model = OpenAIChatModel(settings_for(srv, llm_max_retries=0))
    assert model.complete(logprob_request()).text == "1: yes\n2: no"
    assert [p["logprobs"] for p in srv.params()] == [True, None]


def test_a_server_ignoring_logprobs_is_remembered(srv):
    srv.default("grade_evidence", "1: yes\n2: no")  # a Text without logprobs: the server sends none
    model = OpenAIChatModel(settings_for(srv))
    assert model.complete(logprob_request()).logprobs is None
    model.complete(logprob_request())
    assert [p["logprobs"] for p in srv.params()] == [True, None]


@pytest.mark.parametrize("empty", [NullContent(refusal="I can't grade these."), Text("", finish_reason="length"),
                                   Text("")])
def test_a_reply_with_no_tokens_says_nothing_about_logprobs(srv, empty):
    # An empty reply (a refusal, a budget spent before any text) has no tokens to carry
    # probabilities: it was taken for a server that ignores them, and the grader never asked
    # for them again for the rest of the process.
    srv.script("grade_evidence", empty)
    srv.default("grade_evidence", Text("1: yes", logprobs=LABELS))
    model = OpenAIChatModel(settings_for(srv))
    model.complete(logprob_request())
    assert model.complete(logprob_request()).logprobs is not None
    assert [p["logprobs"] for p in srv.params()] == [True, True]


def test_a_request_changed_by_what_the_server_refused_earlier_says_so(srv):
    """The memory of refusals is a record (crag.llm.server_memory) passed in, and the request it
    changes is marked, so that the audit can say why two identical questions differ."""
    from crag.llm.server_memory import ServerMemory

    srv.reject_params = {"temperature"}
    srv.default("grade_evidence", "[1, 0]")
    memory = ServerMemory()
    model = OpenAIChatModel(settings_for(srv, llm_max_retries=0), memory=memory)
    assert model.complete(grade_request()).adapted == ()  # refused, then sent without: not from memory
    assert model.complete(grade_request()).adapted == ("temperature",)
    assert OpenAIChatModel(settings_for(srv, llm_max_retries=0), memory=ServerMemory()).memory is not memory
    assert next(iter(memory.as_dict().values()))["refused"] == ["temperature"]


def test_odd_token_entries_are_read_and_the_rest_of_the_reply_with_them():
    """A separator at ``1e-7`` (a float rounding above 0), a ``null`` logprob (how nlohmann-json,
    llama.cpp's, writes -inf and NaN) and a label sent as ``bytes`` alone: each discarded the
    whole reply's probabilities, and the server was taken for one that ignores them."""
    from crag.llm.logprobs import read_logprobs

    tokens = read_logprobs({"content": [
        {"token": "1", "logprob": 0.0, "top_logprobs": [{"token": "1", "logprob": None}]},
        {"token": ":", "logprob": 1e-7, "top_logprobs": []},
        {"bytes": list(b" yes"), "logprob": -0.2,
         "top_logprobs": [{"token": " yes", "logprob": -0.2}, {"bytes": list(b" no"), "logprob": -1.7},
                          {"token": " nope", "logprob": None}, {"token": " maybe", "logprob": "bad"}]},
        {"token": "\n", "logprob": None},
    ]})
    assert [t.token for t in tokens] == ["1", ":", " yes", "\n"]
    assert [t.logprob for t in tokens] == [0.0, 0.0, -0.2, float("-inf")]
    assert tokens[0].top == (("1", float("-inf")),)
    assert tokens[2].top == ((" yes", -0.2), (" no", -1.7), (" nope", float("-inf")))
    assert read_logprobs({"content": []}) is None and read_logprobs({"content": [None, 3]}) is None
    odd = read_logprobs({"content": [{"token": " yes", "logprob": -0.1, "top_logprobs": 5},
                                     {"token": " no", "logprob": -0.2, "top_logprobs": {"no": -0.2}}]})
    assert [(t.token, t.top) for t in odd] == [(" yes", ()), (" no", ())]  # was a TypeError traceback


def test_a_reply_with_odd_token_entries_is_no_server_ignoring_logprobs(srv):
    odd = [("1", 0.0, [("1", 0.0)]), (":", 1e-7, [(":", 1e-7)]), (" yes", -0.2, [(" yes", -0.2), (" no", None)])]
    srv.default("grade_evidence", Text("1: yes", logprobs=odd))
    model = OpenAIChatModel(settings_for(srv))
    reply = model.complete(logprob_request())
    assert [t.token for t in reply.logprobs] == ["1", ":", " yes"]
    model.complete(logprob_request())
    assert [p["logprobs"] for p in srv.params()] == [True, True]  # still asked: nothing was refused
