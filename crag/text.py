"""Text analysis shared by the index, the offline backend and the prompts: pure, no I/O.

One tokenizer, one stemmer, one stop-word list, so that "a content word" means the same
thing everywhere crag compares texts:

* ``words(text)``: the lower-cased runs of letters and digits (``[^\\W_]+``, any script),
  accents folded (``fold_diacritics``); ``_``, apostrophes and punctuation end a word
  (``snake_case`` is two words).
* ``stem(word)``: a light English suffix stripper for a lower-cased word: plurals,
  ``-ing``, ``-ed`` (``tokens`` → ``token``, ``settings`` → ``sett``).
* ``STOPWORDS``: English function words. The hash embedder and the full-text query drop
  them, so changing this list changes every hash vector: an index built before must be
  rebuilt (bump ``HashEmbedder``'s scheme version with it).
* ``content_words(text)``: the stemmed words of ``text`` that are not stop words, in order,
  repeats kept: the hash embedder's features.
* ``keywords(text)``: what a question asks about: stemmed content words without repeats,
  with ``QUESTION_FILLER`` (``tell``, ``explain``, ``please``...) dropped too and runs of
  CJK characters turned into character bigrams. The offline backend ranks evidence by them.
* ``unspaced(word)``: a word of ``words`` cut where it holds Han or Kana (scripts written
  without spaces, where one "word" is a whole clause): its other parts, and the terms of its
  Han and Kana, their function characters (``FUNCTION_CHARACTERS``: every Hiragana, and
  Chinese particles such as 的 and 是) left out and the rest as overlapping character bigrams,
  a character alone as itself. Grounding reads a text's content words by it.
* ``in_vocabulary(word, vocabulary)``: whether a stemmed word is one of a text's: the same
  stem, or a word and a longer one sharing their first ``PREFIX`` letters or more
  (``config`` and ``configuration``). Grounding and the offline backend compare by it.
* ``fold_diacritics(text)``: ``text`` with the accents full-text search folds (``DIACRITICS``)
  folded: ``Café`` is ``Cafe``; ``words`` folds them.
* ``one_line(text, limit)``: any text as one line of single spaces, for messages.
"""

from __future__ import annotations

import re

__all__ = [
    "DIACRITICS",
    "FUNCTION_CHARACTERS",
    "HAN_KANA",
    "PREFIX",
    "QUESTION_FILLER",
    "STOPWORDS",
    "WORD",
    "content_words",
    "fold_diacritics",
    "grams",
    "in_vocabulary",
    "keywords",
    "one_line",
    "stem",
    "unspaced",
    "words",
]

STOPWORDS = frozenset(
    """
    a about above after again against all am an and any are as at be because been before
    being below between both but by can could did do does doing down during each few for
    from further had has have having he her here hers herself him himself his how i if in
    into is it its itself just me more most my myself no nor not of off on once only or
    other our ours ourselves out over own same she should so some such than that the their
    theirs them themselves then there these they this those through to too under until up
    very was we were what when where which while who whom why will with would you your
    yours yourself yourselves also may might must shall using use used via per etc e g eg
    ie i.e let lets s t don doesn isn aren wasn weren won can't cannot
    """.split()
)

# Words a question is phrased with but that say nothing about what it asks for.
QUESTION_FILLER = frozenset(
    """
    couldn didn either else ever every get gets got hasn haven however like ll much need needs
    now one ought please re shouldn upon us way whats whether within without wouldn yes yet
    tell explain show give know want work works find look describe mean means anything
    something someone anyone thing things kind sort
    """.split()
)

# The letters with diacritics SQLite's FTS5 folds (``unicode61 remove_diacritics 2``, the
# embedded store's tokenizer), by the letter it folds them to, and the combining marks it drops
# from a word. The PostgreSQL store folds the same ones, in chunks and files as in queries
# (``postgres_schema``), and so does the search's word filter (``fold_diacritics``), so that
# ``cafe`` finds ``café`` (and ``Zürich`` finds ``Zurich``) in both stores. FTS5 folds no other:
# not ``ø``, ``æ``, ``ß``, ``ł`` or ``đ`` (PostgreSQL's ``unaccent`` does, so crag does not use it:
# the two stores would find different things). ``tests/test_store_postgres.py`` checks this
# table against SQLite's tokenizer. ``words`` folds them too, so grounding finds the
# ``Schrödinger`` of a passage in an answer or a question that writes ``Schrodinger``.
DIACRITICS: dict[str, str] = {
    "a": "ÀÁÂÃÄÅàáâãäåĀāĂăĄąǍǎǞǟǺǻȀȁȂȃȦȧḀḁẠạẢảẤấẦầẨẩẪẫẬậẮắẰằẲẳẴẵẶặ\u212b",
    "b": "ḂḃḄḅḆḇ",
    "c": "ÇçĆćĈĉĊċČčḈḉ",
    "d": "ĎďḊḋḌḍḎḏḐḑḒḓ",
    "e": "ÈÉÊËèéêëĒēĔĕĖėĘęĚěȄȅȆȇȨȩḔḕḖḗḘḙḚḛḜḝẸẹẺẻẼẽẾếỀềỂểỄễỆệ",
    "f": "Ḟḟ",
    "g": "ĜĝĞğĠġĢģǦǧǴǵḠḡ",
    "h": "ĤĥȞȟḢḣḤḥḦḧḨḩḪḫẖ",
    "i": "ÌÍÎÏìíîïĨĩĪīĬĭĮįİǏǐȈȉȊȋḬḭḮḯỈỉỊị",
    "j": "Ĵĵǰ",
    "k": "ĶķǨǩḰḱḲḳḴḵ",
    "l": "ĹĺĻļĽľḶḷḸḹḺḻḼḽ",
    "m": "ḾḿṀṁṂṃ",
    "n": "ÑñŃńŅņŇňǸǹṄṅṆṇṈṉṊṋ",
    "o": "ÒÓÔÕÖòóôõöŌōŎŏŐőƠơǑǒǪǫǬǭȌȍȎȏȪȫȬȭȮȯȰȱṌṍṎṏṐṑṒṓỌọỎỏỐốỒồỔổỖỗỘộỚớỜờỞởỠỡỢợ",
    "p": "ṔṕṖṗ",
    "r": "ŔŕŖŗŘřȐȑȒȓṘṙṚṛṜṝṞṟ",
    "s": "ŚśŜŝŞşŠšȘșṠṡṢṣṤṥṦṧṨṩẛ",
    "t": "ŢţŤťȚțṪṫṬṭṮṯṰṱẗ",
    "u": "ÙÚÛÜùúûüŨũŪūŬŭŮůŰűŲųƯưǓǔǕǖǗǘǙǚǛǜȔȕȖȗṲṳṴṵṶṷṸṹṺṻỤụỦủỨứỪừỬửỮữỰự",
    "v": "ṼṽṾṿ",
    "w": "ŴŵẀẁẂẃẄẅẆẇẈẉẘ",
    "x": "ẊẋẌẍ",
    "y": "ÝýÿŶŷŸȲȳẎẏẙỲỳỴỵỶỷỸỹ",
    "z": "ŹźŻżŽžẐẑẒẓẔẕ",
    "": "\u0300\u0301\u0302\u0303\u0304\u0306\u0307\u0308\u0309\u030a\u030b\u030c\u030f\u0311\u031b\u0323\u0324"
        "\u0325\u0326\u0327\u0328\u032d\u032e\u0330\u0331",  # combining marks: dropped
}

_FOLDING = str.maketrans({c: target for target, chars in DIACRITICS.items() for c in chars})


def fold_diacritics(text: str) -> str:
    """``text`` with the diacritics FTS5 folds (``DIACRITICS``) folded: ``Café`` is ``Cafe``."""
    return text.translate(_FOLDING) if not text.isascii() else text


WORD = re.compile(r"[^\W_]+")
_CJK_RUN = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]+")


# Full-width ASCII (``ＡＰＩ``, ``３０``, as Chinese and Japanese input methods type Latin text)
# -> ASCII, so that an answer's "API" is the word its evidence writes ``ＡＰＩ``.
_FULL_WIDTH = str.maketrans({chr(c): chr(c - 0xFEE0) for c in range(0xFF01, 0xFF5F)})


def words(text: str) -> list[str]:
    """The lower-cased words of ``text``, in order, their accents folded (``fold_diacritics``)
    and full-width letters and digits read as ASCII ones."""
    if not text.isascii():
        text = text.translate(_FULL_WIDTH)
    return WORD.findall(fold_diacritics(text.lower()))


def stem(word: str) -> str:
    """A light English suffix stripper for a lower-cased word: plurals, -ing, -ed ("retries"
    and "retried" are both "retry")."""
    if word[-1:] not in ("s", "g", "d"):  # no suffix this stripper knows (the common case)
        return word
    n = len(word)
    if n <= 3 or word.isdigit():
        return word
    if word.endswith(("ies", "ied")) and n > 4:  # "retries", "retried": "retry"
        return word[:-3] + "y"
    if word.endswith("sses"):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        word = word[:-1]
        n -= 1
    if word.endswith("ing") and n > 5:
        return word[:-3]
    if word.endswith("ed") and n > 4:
        return word[:-2]
    return word


_stem_cache: dict[str, str | None] = {}


def content_words(text: str) -> list[str]:
    """Stemmed content words of ``text`` in order (stop words dropped, repeats kept)."""
    out = []
    cache = _stem_cache
    for word in WORD.findall(text.lower()):
        s = cache.get(word, "")
        if s == "":
            s = None if word in STOPWORDS else stem(word)
            if len(cache) < 500_000:
                cache[word] = s
        if s is not None:
            out.append(s)
    return out


_QUESTION_STOPWORDS = STOPWORDS | QUESTION_FILLER


def keywords(text: str) -> list[str]:
    """What ``text`` asks about: stemmed content words of two characters or more, filler
    dropped, in order, without repeats; CJK runs become character bigrams."""
    out: list[str] = []
    seen: set[str] = set()
    for run in WORD.findall(_CJK_RUN.sub(" ", text).lower()):  # CJK: bigrams, below
        if run in _QUESTION_STOPWORDS:
            continue
        word = stem(run)
        if len(word) < 2 or word in _QUESTION_STOPWORDS or word in seen:
            continue
        seen.add(word)
        out.append(word)
    for run in _CJK_RUN.findall(text):
        for gram in grams(run):
            if gram not in seen:
                seen.add(gram)
                out.append(gram)
    return out


def grams(run: str) -> list[str]:
    """A run of characters written without spaces as its overlapping character bigrams, or
    the character alone: ``营业时间`` is ``营业``, ``业时``, ``时间``."""
    return [run] if len(run) == 1 else [run[i : i + 2] for i in range(len(run) - 1)]


# Han (with its compatibility ideographs and 々), Hiragana and Katakana letters, as a character
# class's contents (``HAN_KANA``); and of them the function
# characters, which say how a sentence is built rather than what it is about, as stop words do
# in English: every Hiragana (particles and endings: は, に, から, しています; the content of
# Japanese is written in Han and Katakana), and Chinese particles, the copula and question
# words (的, 了, 是, 吗, 呢, 什么, 哪, 谁, 怎; 何 is Japanese "what").
HAN_KANA = "\u3005\u3041-\u3096\u309d-\u309f\u30a1-\u30fa\u30fc-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_HAN_KANA = re.compile(f"[{HAN_KANA}]+")
FUNCTION_CHARACTERS = frozenset(
    [chr(c) for c in range(0x3041, 0x3097)] + [chr(c) for c in range(0x309D, 0x30A0)]
    + list("的了是吗呢吧啊呀么什哪谁怎何嗎麼誰")
)
_FUNCTION = re.compile("[" + "".join(sorted(FUNCTION_CHARACTERS)) + "]+")


def unspaced(word: str) -> tuple[list[str], list[str]]:
    """``word`` (one of ``words``) cut where it holds Han or Kana: its other parts (``python3``
    of ``python3中文``, ``9`` of ``上午9点``), and the terms of its runs of Han and Kana, each run
    parted at its function characters (``FUNCTION_CHARACTERS``) and the parts as ``grams``:
    ``北京办公室的营业时间是什么`` is ``北京``, ``京办``, ``办公``, ``公室``, ``营业``, ``业时``, ``时间``."""
    if word.isascii() or not _HAN_KANA.search(word):
        return [word], []
    other = [part for part in _HAN_KANA.split(word) if part]
    terms = [gram for run in _HAN_KANA.findall(word) for part in _FUNCTION.split(run) if part for gram in grams(part)]
    return other, terms


PREFIX = 4  # fewest letters two words share at their start to count as one (``in_vocabulary``)


def in_vocabulary(word: str, vocabulary: set[str] | frozenset[str]) -> bool:
    """Whether ``word`` is in ``vocabulary``, or it and a word of it, both at least ``PREFIX``
    letters long, are one the other's beginning."""
    if word in vocabulary:
        return True
    if len(word) < PREFIX:
        return False
    return any(len(other) >= PREFIX and (other.startswith(word) or word.startswith(other)) for other in vocabulary)


def one_line(text: object, limit: int | None = None) -> str:
    """``text`` on one line (runs of whitespace become one space), cut to ``limit`` characters."""
    line = " ".join(str(text).split())
    if limit is not None and len(line) > limit:
        return line[: max(limit - 1, 0)] + "…"
    return line
