"""The offline answer's quoted Markdown tables (docs/grounding.md, "The offline answer"): the
rows that answer the question, each as written, cited at the line the quote starts at."""

from __future__ import annotations

from crag import Agent
from crag.config import Settings
from crag.llm.offline import OfflineChatModel
from crag.state import EvidenceItem

from .fakes import FakeToolbox

_NAMES = ("MODE", "URL", "KEY", "MODEL", "COLOR", "SIZE", "DEPTH", "WIDTH", "SPEED", "TIMEOUT", "RETRIES",
          "LEVEL", "ORDER", "DELAY")
_VALUES = ("auto", "none", "none", "quasar-2", "blue", "12", "3", "40", "1450", "60", "3", "info", "fifo", "5")
ROWS = [f"| `PUMP_{name}` | {value} | the {name.lower()} of the pump |" for name, value in zip(_NAMES, _VALUES)]
BIG = EvidenceItem("vector_search", "kb/big.md",
                   "# Pump settings\n\n| setting | default | use |\n| --- | --- | --- |\n" + "\n".join(ROWS),
                   1, 4 + len(ROWS), 0.5)


def ask(question: str, *items: EvidenceItem):
    return Agent(OfflineChatModel(), FakeToolbox({"vector_search": [list(items)]}), Settings()).ask(question)


def body_of(result) -> str:
    return result.answer.split("\n\n---\n")[0]


def test_a_long_table_is_quoted_with_the_rows_holding_most_of_the_question():
    """Every row of a 16-line table holds PUMP: its first three rows were quoted, without the
    asked PUMP_TIMEOUT row, and the answer was 'answered'. The rows holding the most of the
    question's words are quoted, each as written."""
    result = ask("What is the default of PUMP_TIMEOUT?", BIG)
    body = body_of(result)
    assert "| setting | default | use |\n| --- | --- | --- |\n| `PUMP_TIMEOUT` | 60 | the timeout of the pump |\n" \
        in body, body
    assert "PUMP_MODE" not in body and "PUMP_URL" not in body, body
    # two rows asked about: both, in the table's order
    body = body_of(ask("What are the defaults of PUMP_SPEED and PUMP_DELAY?", BIG))
    assert "| `PUMP_SPEED` | 1450 | the speed of the pump |\n| `PUMP_DELAY` | 5 | the delay of the pump |\n" in body, body
    assert "PUMP_MODE" not in body, body


THRESHOLDS = EvidenceItem(
    "vector_search", "kb/th.md",
    "# Pump thresholds\n\n| setting | default | meaning |\n| --- | --- | --- |\n"
    "| `PUMP_LOW` | 0.3 | the low pressure ratio, in [0, 1] |\n"
    "| `PUMP_HIGH` | 0.8 | the high pressure ratio, in [0, 1] |\n"
    "| `PUMP_STEPS` | 4 | ramp steps, see [2] and [3] |", 1, 7, 0.5)
OTHER = EvidenceItem("vector_search", "kb/other.md", "Invoices are sent monthly.", 1, 1, 0.3)
OTHER_2 = EvidenceItem("vector_search", "kb/third.md", "The office opens at nine.", 1, 1, 0.2)


def test_a_quoted_table_keeps_its_bracketed_text_as_written():
    """A quoted table lost every [...] of its cells ("in [0, 1]" quoted as "in", "see [2] and
    [3]" as ""): renumbering read them as markers. They are the document's text; crag's marker is
    the line below the table, and a row's "[2]" cites no item (the footer lists only the table's)."""
    for items in ((THRESHOLDS,), (THRESHOLDS, OTHER, OTHER_2)):
        result = ask("What is the range of the PUMP_HIGH pressure ratio?", *items)
        body = body_of(result)
        table = THRESHOLDS.text.split("\n\n", 1)[1]
        assert f"\n{table}\n\n[1]" in body, body
        assert [c.path for c in result.citations] == ["kb/th.md"], result.citations
        assert result.state.grounding.verdict == "answered"
        # streamed, the chunks join to that same answer
        stream = Agent(OfflineChatModel(), FakeToolbox({"vector_search": [list(items)]}), Settings()).stream(
            "What is the range of the PUMP_HIGH pressure ratio?")
        assert "".join(stream) == stream.result.answer and body_of(stream.result) == body


def test_a_refused_offline_answer_keeps_its_quoted_table_as_written():
    """Under a refusal's opening the offline answer's tables are still quotes, read as written."""
    result = ask("What is the range of the PUMP_HIGH pressure ratio in Terraform?", THRESHOLDS)
    assert result.state.grounding.verdict == "not_answered" and "mentions Terraform" in result.answer
    assert "| `PUMP_STEPS` | 4 | ramp steps, see [2] and [3] |\n" in result.answer, result.answer


def test_a_models_table_still_has_its_markers_read():
    """A model's answer cites inside its tables: those markers are still renumbered (and one
    naming no item goes); only the offline answer's tables are quotes."""
    from crag.answer import renumber

    text, order = renumber("The thresholds:\n\n| setting | default |\n| --- | --- |\n| PUMP_HIGH | 0.8 [2] |\n"
                           "| PUMP_LOW | 0.3 [7] |", 2)
    assert "| PUMP_HIGH | 0.8 [1] |\n| PUMP_LOW | 0.3 |" in text and order == [1], text


SETTINGS = EvidenceItem(
    "vector_search", "kb/settings.md",
    "# Settings\n\n## The request\n\nEach setting below shapes one request to the pump controller.\n\n"
    "| setting | default | use |\n| --- | --- | --- |\n"
    "| `PUMP_MODE` | `auto` when `PUMP_KEY` is set, else `manual` | mode |\n"
    "| `PUMP_URL` | the vendor's default (`https://pump.example/v1`) | the server address |\n"
    "| `PUMP_KEY` | none | sent as a bearer token |\n| `PUMP_MODEL` | `quasar-2` | the model field |\n"
    "| `PUMP_TIMEOUT` | 60 | seconds per request |\n| `PUMP_RETRIES` | 3 | retries per call |\n\nNothing else is read.",
    1, 16, 0.5)


def table_citation(result, row: str = "|"):
    """The citation of the marker below the quoted table that holds ``row``."""
    body = body_of(result)
    n = int(body[body.index(row):].split("|\n\n[", 1)[1].split("]", 1)[0])
    return next(c for c in result.citations if c.n == n)


def test_a_quoted_table_is_cited_at_its_header_line_where_the_quote_starts():
    """A whole table (lines 7-14) was cited at line 10, the PUMP_URL row (the row sharing most
    words with the whole table), for every question: neither where the quote starts nor the
    answer's row. A quote is cited at the line it starts with, its header, to its last row."""
    for question in ("What is the default value of PUMP_TIMEOUT?", "How many retries per call does PUMP_RETRIES allow?"):
        cited = table_citation(ask(question, SETTINGS))
        assert (cited.path, cited.line, cited.end_line) == ("kb/settings.md", 7, 14), cited
    # a long table's quote: its header (line 3) and the asked row (line 14)
    result = ask("What is the default of PUMP_TIMEOUT?", BIG)
    cited = table_citation(result)
    assert (cited.line, cited.end_line) == (3, 14), cited
    assert "[1] kb/big.md:L3\n" in result.answer, result.answer


def test_a_quoted_table_is_cited_at_its_own_header_when_another_table_shares_it():
    """Two tables of one page with the same header: each quote is cited at the header of the
    table its rows come from."""
    text = ("| setting | default |\n| --- | --- |\n| `PUMP_MODE` | auto |\n\nThe valve settings:\n\n"
            "| setting | default |\n| --- | --- |\n| `VALVE_TIMEOUT` | 15 |\n| `VALVE_MODE` | closed |")
    item = EvidenceItem("vector_search", "kb/two.md", text, 20, 30, 0.5)
    result = ask("What is the default of VALVE_TIMEOUT?", item)
    assert "| `VALVE_TIMEOUT` | 15 |" in body_of(result)
    assert (table_citation(result, "`VALVE_TIMEOUT`").line, table_citation(result, "`PUMP_MODE`").line) == (26, 20)
    assert table_citation(result, "`VALVE_TIMEOUT`").end_line == 29


def test_some_rows_of_a_table_rank_after_sentences_holding_as_many_of_the_question():
    """A long table's quote is its rows holding the most of the question's words, each row some
    of them ("account", "create", "service" beside "organization"); together they hold as many
    as a sentence that answers, and a better retrieval score put the rows first. Rows quoted in
    part rank after a sentence holding as many words; a whole table as before."""
    filler = "\n".join(f"| **Option {n}** | Yes | Yes |" for n in range(10))
    sso = EvidenceItem("vector_search", "kb/sso.md",
                       "| | **Basic SSO** | **Managed SSO** |\n| --- | --- | --- |\n"
                       "| **User accounts** | Users keep their personal account | Owned by the organization |\n"
                       "| **Personal content** | Users can create content | Only within the organization |\n"
                       "| **Setup** | Self-service from organization settings | With the team |\n" + filler,
                       1, 15, 0.9)
    prose = [EvidenceItem("vector_search", f"kb/accounts{n}.md",
                          f"A service account of the organization is created by an admin, step {n}.", 1, 1, 0.5)
             for n in range(5)]
    body = body_of(ask("How do I create a service account in an organization?", sso, *prose))
    assert "**Basic SSO**" not in body and body.count("A service account of the organization") == 5, body
    whole = EvidenceItem("vector_search", "kb/short.md", sso.text.split("\n| **Option")[0], 1, 5, 0.9)
    assert "**Basic SSO**" in body_of(ask("How do I create a service account in an organization?", whole, *prose))
