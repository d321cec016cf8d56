"""Chinese and Japanese answers are grounded by their substance, as English ones are.

SPEC §7: "item K supports a sentence when K's text holds its substance (its content words, and
every number ... it contains)". Han and Kana are written without spaces, so a whole clause was
one "word": a right answer copied from its line was judged about something else (the question's
one long word was none of the passage's), and an invented one ("the office has closed for
good") was supported by the heading above the line, whose one word opens it (``in_vocabulary``
takes a word and a longer one sharing four letters as one). Runs of Han and Kana are now their
character bigrams, function characters (Hiragana, 的, 是...) left out, and a number written
between them ("上午9点") is a number the evidence must hold.
"""

from __future__ import annotations

import json

import pytest

from crag import Agent, Settings
from crag.answer import NOT_ADDRESSED
from crag.grounding import QUOTES_FOCUS_SHARE, addresses, claims, ground, says_nothing_new
from crag.grounding.asked import missing
from crag.llm.scripted import ScriptedChatModel
from crag.state import EvidenceItem

from .fakes import FakeToolbox, clean_env, cli, route, search_plan

ZH_TEXT = "# 办公室\n\n## 北京办公室\n\n北京办公室周一至周五上午9点到下午6点营业。"
ZH = EvidenceItem("grep_search", "docs/zh.md", ZH_TEXT, 1, 5)
ZH_QUESTION = "北京办公室的营业时间是什么？"
ZH_RIGHT = "北京办公室周一至周五上午9点到下午6点营业[1]。"
JA_TEXT = "## 東京オフィス\n\n東京オフィスは月曜日から金曜日まで午前9時から午後6時まで営業しています。"
JA = EvidenceItem("grep_search", "docs/faq.md", JA_TEXT, 11, 13)
JA_RIGHT = "東京オフィスは月曜日から金曜日まで営業しています[1]。"


def test_han_and_kana_are_read_as_character_bigrams_without_function_characters() -> None:
    from crag.text import unspaced

    assert unspaced("北京办公室的营业时间是什么") == ([], ["北京", "京办", "办公", "公室", "营业", "业时", "时间"])
    assert unspaced("上午9点营业") == (["9"], ["上午", "点营", "营业"])
    assert unspaced("東京オフィスは営業しています") == ([], ["東京", "京オ", "オフ", "フィ", "ィス", "営業"])
    assert unspaced("configuration") == (["configuration"], [])
    assert claims("上午9点到下午6点").anchors == (("number", "9"), ("number", "6"))


def test_a_right_chinese_answer_is_supported_at_its_line() -> None:
    g = ground(ZH_RIGHT, (ZH,), "note", ZH_QUESTION)
    assert g.body == ZH_RIGHT and g.report.supported == 1
    assert [(s.source, s.start_line) for s in g.sources] == [("docs/zh.md", 5)]  # not the heading, L3


@pytest.mark.parametrize("mode", ["note", "strict"])
def test_an_invented_chinese_answer_is_unsupported(mode: str) -> None:
    g = ground("北京办公室已经永久关闭了[1]。", (ZH,), mode, ZH_QUESTION)  # "closed for good"
    assert g.report.supported == 0 and g.sources == ()
    assert g.body == ("北京办公室已经永久关闭了 [unsupported]。" if mode == "note" else "")


def test_a_number_the_evidence_does_not_hold_is_unsupported_between_kana() -> None:
    g = ground("東京オフィスは午前7時から午後11時まで営業しています[1]。", (JA,), "note", "東京オフィスは何時から営業していますか？")
    assert g.report.supported == 0


def test_a_right_japanese_answer_is_supported_at_its_line() -> None:
    g = ground(JA_RIGHT, (JA,), "note", "東京オフィスは何曜日に営業していますか？")
    assert g.body == JA_RIGHT and [(s.source, s.start_line) for s in g.sources] == [("docs/faq.md", 13)]


def test_the_passage_of_a_right_answer_addresses_the_question() -> None:
    assert addresses(ZH_QUESTION, [ZH_TEXT])
    assert addresses(ZH_QUESTION, [ZH_TEXT], QUOTES_FOCUS_SHARE)  # the offline answer's quotes
    assert not says_nothing_new(ZH_QUESTION, [ZH_RIGHT])


def _simple(reply: str, env: dict[str, str] | None = None):
    replies = {"analyze_and_route": [route("simple")], "plan": [search_plan("北京办公室")], "synthesize": [reply]}
    return Agent(ScriptedChatModel(replies), FakeToolbox({"vector_search": [[ZH]]}), Settings(**(env or {}))).ask(
        ZH_QUESTION)


def test_a_right_chinese_answer_is_answered() -> None:
    result = _simple(ZH_RIGHT)
    assert result.state.grounding.verdict == "answered"
    assert result.answer.startswith(ZH_RIGHT)
    assert not any(e["event"] == "question_not_addressed" for e in result.audit)


def test_an_invented_chinese_answer_is_not_kept_in_strict_mode() -> None:
    result = _simple("北京办公室已经永久关闭了[1]。", {"grounding": "strict"})
    assert result.state.grounding.supported == 0 and "永久关闭" not in result.answer


def test_the_offline_answer_quotes_the_line_and_answers(tmp_path, monkeypatch) -> None:
    clean_env(monkeypatch)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KB_AGENT_INDEX_DIR", str(tmp_path / "index"))
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "zh.md").write_text(ZH_TEXT + "\n", encoding="utf-8")
    assert cli("index", "docs")[0] == 0
    code, out, err = cli("ask", "--json", ZH_QUESTION)
    assert code == 0, err
    result = json.loads(out)
    assert result["grounding"]["verdict"] == "answered"
    assert not result["body"].startswith(NOT_ADDRESSED)
    assert "北京办公室周一至周五上午9点到下午6点营业。" in result["body"]
    assert [(c["path"], c["line"]) for c in result["citations"]] == [("docs/zh.md", 5)]


OSAKA_TEXT = "# 大阪オフィス\n\n大阪オフィスは月曜日から金曜日の午前１０時から午後７時まで営業しています。"
OSAKA = EvidenceItem("grep_search", "kb/osaka.md", OSAKA_TEXT, 1, 3)
OSAKA_QUESTION = "大阪オフィスの営業時間は何時から何時までですか？"
OSAKA_RIGHT = "大阪オフィスは月曜日から金曜日の午前10時から午後7時まで営業しています [1]。"


@pytest.mark.parametrize(("answer", "item"), [
    (OSAKA_RIGHT, OSAKA),  # full-width digits in the evidence, ASCII in the answer
    ("北京办公室周一至周五上午９点到下午６点营业 [1]。", ZH),  # and the other way round
], ids=["ascii-answer", "full-width-answer"])
def test_full_width_digits_are_the_same_number_as_ascii_ones(answer: str, item: EvidenceItem) -> None:
    g = ground(answer, (item,), "note", OSAKA_QUESTION if item is OSAKA else ZH_QUESTION)
    assert g.report.supported == 1 and "[unsupported]" not in g.body


@pytest.mark.parametrize("answer", ["本项目要求Python版本３．１０以上 [1]。", "每月配额为１，５００次请求 [1]。",
                                    "会议时间是９：００开始 [1]。", "参加人数为１０－１５人 [1]。"])
def test_a_full_width_point_or_comma_between_digits_is_the_ascii_one(answer: str) -> None:
    """An input method in full-width mode types the point and the comma too: "３．１０" was the
    numbers 3 and 10, which "3.10" does not hold."""
    item = EvidenceItem("vector_search", "kb/hr.md", "本项目要求Python版本3.10以上。\n\n每月配额为1,500次请求。\n\n"
                        "会议时间是9:00开始。参加人数为10-15人。", 3, 7, 0.5)
    g = ground(answer, (item,), "note", "Python版本要求和每月配额是多少？")
    assert g.report.supported == 1 and "[unsupported]" not in g.body
    assert claims("版本３．１０").anchors == (("number", "3.10"),)


def test_a_full_width_number_the_evidence_does_not_hold_is_unsupported() -> None:
    g = ground("大阪オフィスは午前１１時から営業しています [1]。", (OSAKA,), "note", OSAKA_QUESTION)
    assert g.report.supported == 0
    assert claims("午前１０時").anchors == (("number", "10"),)


def test_a_right_answer_from_a_line_with_full_width_digits_is_answered() -> None:
    replies = {"analyze_and_route": [route("simple")], "plan": [search_plan("大阪オフィス")],
               "synthesize": [OSAKA_RIGHT]}
    result = Agent(ScriptedChatModel(replies), FakeToolbox({"vector_search": [[OSAKA]]}), Settings()).ask(OSAKA_QUESTION)
    assert result.state.grounding.verdict == "answered"
    assert result.answer.startswith(OSAKA_RIGHT + "\n\n[1] kb/osaka.md:L3")


KEYS = EvidenceItem("vector_search", "kb/keys.md", "# 鍵\n\nＡＰＩ　ＫＥＹ　ｒｏｔａｔｉｏｎ happens every ３０ days.", 1, 3, 0.5)
KEYS_QUESTION = "How often does API key rotation happen?"


def test_a_question_in_ascii_is_answered_by_a_line_in_full_width_letters() -> None:
    """Input methods type Latin text full-width too: "ＡＰＩ" was no word "API", so the answer
    copied from the line was refused as about something else, naming "API" as a term no document
    mentions."""
    replies = {"analyze_and_route": [route("simple")], "plan": [search_plan("rotation")],
               "synthesize": ["API key rotation happens every 30 days [1]."]}
    result = Agent(ScriptedChatModel(replies), FakeToolbox({"vector_search": [[KEYS]]}), Settings()).ask(KEYS_QUESTION)
    assert result.state.grounding.verdict == "answered"
    assert result.answer.startswith("API key rotation happens every 30 days [1].\n\n[1] kb/keys.md:L3")
    assert missing(KEYS_QUESTION, [KEYS.text]) == []
