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
