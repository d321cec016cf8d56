"""Grounding benchmark: are answer sentences supported, and do citations open at the text?

Run from the repository root::

    .venv/bin/python -m benchmarks.grounding            # all questions (a minute or two)
    .venv/bin/python -m benchmarks.grounding --quick    # 20 questions

Two parts:

1. **Offline answers.** Both shared documentation corpora are indexed together (hash
   embedder) into a temporary directory, and every question of
   ``benchmarks/questions.jsonl`` is asked of the offline backend. Reported: the share of
   answer sentences that grounding finds supported; the share of citations whose line,
   opened in its file, shows the start of the sentence quoted for it ("line-exact"); the
   share of citations in the gold file, and inside the gold file's relevant span. The
   questions name a gold file, not a span, so the span is computed: the Markdown section
   of the gold file (heading to the next heading of the same or a higher level) that holds
   the most of the question's keywords.
2. **Labelled answers.** ``benchmarks/grounding_cases.json`` holds hand-written answer
   sentences about five real passages, each labelled with the verdict it deserves: copied
   (with and without a marker) and paraphrased sentences are supported; invented,
   number-changed and negated ones are not. Each case's answer is grounded against its
   passage and the next case's passage (a distractor), and the "unsupported" verdict is
   scored: precision, recall, and the confusion per kind.

Both parts count the rule each verdict names (``crag.grounding.RULES``, ``clauses``,
``none``): how many sentences it decided, and on the labelled answers how many of those
verdicts match the label (the rule's precision), so a rule that does not pay for itself
shows it.

Results go to ``benchmarks/results/grounding.json`` and ``.md`` (``--out DIR`` elsewhere).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common import (
    SHARED,
    environment,
    fmt,
    markdown_table,
    out_dir,
    quick_out,
    run_main,
    write_json,
    write_text,
)

ROOT = Path(__file__).resolve().parents[1]
CORPORA = ("fastapi_docs", "hf_hub_docs")
QUESTIONS = Path(__file__).with_name("questions.jsonl")
CASES = Path(__file__).with_name("grounding_cases.json")
RULE_CASES = Path(__file__).with_name("grounding_rule_cases.json")
RESULTS = Path(__file__).with_name("results")
# A quoted line and its markers: the first is the quote's own source, any others are files
# grounding found holding the same sentence (corroborating: not verbatim, not checked here).
_QUOTE = re.compile(r"^- (.*?) \[(\d+)\](?:\[\d+\])*$")
_HEADING = re.compile(r"^(#{1,6})\s")


def flat(text: str) -> str:
    return " ".join(text.split())


def relevant_span(path: Path, question: str) -> tuple[int, int]:
    """The 1-based line span of the section of ``path`` that best matches ``question``."""
    from crag.text import keywords

    lines = path.read_text(encoding="utf-8").splitlines()
    heads = [(i, len(m.group(1))) for i, line in enumerate(lines) if (m := _HEADING.match(line))]
    sections = []
    for n, (i, level) in enumerate(heads):
        end = next((j for j, lv in heads[n + 1 :] if lv <= level), len(lines))
        sections.append((i, end))
    if not sections or sections[0][0] > 0:
        sections.append((0, heads[0][0] if heads else len(lines)))
    wanted = set(keywords(question))

    def score(span: tuple[int, int]) -> tuple[float, int]:
        vocab = set(keywords("\n".join(lines[span[0] : span[1]])))
        return (len(wanted & vocab), -(span[1] - span[0]))  # most keywords, then the tightest section

    best = max(sections, key=score)
    return best[0] + 1, best[1]


def offline_part(limit: int | None) -> dict[str, Any]:
    from crag import Agent

    questions = [json.loads(line) for line in QUESTIONS.read_text(encoding="utf-8").splitlines() if line.strip()]
    if limit:
        questions = questions[:limit]
    roots = [str(SHARED / "corpora" / c / "corpus") for c in CORPORA]
    totals = {"questions": 0, "sentences": 0, "supported": 0, "citations": 0, "line_exact": 0,
              "quotes_checked": 0, "in_gold_file": 0, "in_gold_span": 0}
    misses: list[dict[str, Any]] = []
    rules: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="crag-grounding-") as tmp:
        began = time.perf_counter()
        agent = Agent.from_env(roots, environ={}, dotenv=None, llm="offline", index_dir=tmp)
        index_s = time.perf_counter() - began
        began = time.perf_counter()
        with agent:
            for q in questions:
                result = agent.ask(q["question"])
                g = result.state.grounding
                totals["questions"] += 1
                if g is not None:
                    totals["sentences"] += g.sentences
                    totals["supported"] += g.supported
                    for j in g.judgements:
                        rules[j.rule] = rules.get(j.rule, 0) + 1
                gold = (SHARED / "corpora" / q["corpus"] / q["path"]).resolve()
                span = relevant_span(gold, q["question"])
                quotes = {}
                for line in result.answer.split("\n\n---\n")[0].splitlines():
                    m = _QUOTE.match(line)
                    if m:
                        quotes.setdefault(int(m.group(2)), m.group(1))
                for c in result.citations:
                    totals["citations"] += 1
                    path = Path(c.path).resolve()
                    if path == gold:
                        totals["in_gold_file"] += 1
                        if c.line is not None and span[0] <= c.line <= span[1]:
                            totals["in_gold_span"] += 1
                    quote = quotes.get(c.n)
                    if quote is None or c.line is None:
                        continue
                    totals["quotes_checked"] += 1
                    file_lines = path.read_text(encoding="utf-8").splitlines()
                    first = re.sub(r"^\s*(?:>\s*)*(?:[-*+]\s+|\d{1,3}[.)]\s+)?", "", file_lines[c.line - 1])
                    # a blockquote's "> " at each line's start, not in "</abbr> tokens"
                    opened = flat("\n".join(re.sub(r"^\s*(?:>\s?)+", "", line)
                                            for line in file_lines[c.line - 1 : (c.end_line or c.line)]))
                    head = " ".join(quote.split()[:3])
                    if flat(quote) in opened and (head in flat(first) or flat(first) in quote):
                        totals["line_exact"] += 1
                    elif len(misses) < 10:
                        misses.append({"question": q["question"], "path": c.path, "line": c.line,
                                       "quote": quote[:120], "opened": file_lines[c.line - 1][:120]})
        ask_s = time.perf_counter() - began

    def share(a: str, b: str) -> float | None:
        return totals[a] / totals[b] if totals[b] else None

    return {
        **totals,
        "supported_share": share("supported", "sentences"),
        "line_exact_share": share("line_exact", "quotes_checked"),
        "in_gold_file_share": share("in_gold_file", "citations"),
        "in_gold_span_share": share("in_gold_span", "citations"),
        "index_s": index_s,
        "ask_s": ask_s,
        "line_misses": misses,
        "rules": rules,
    }


def labelled_part(path: Path = CASES) -> dict[str, Any]:
    from crag.grounding import ground
    from crag.state import EvidenceItem

    cases = json.loads(path.read_text(encoding="utf-8"))
    items = []
    for c in cases:
        path = SHARED / "corpora" / c["corpus"] / c["path"]
        lines = path.read_text(encoding="utf-8").splitlines()
        items.append(EvidenceItem("read_file", c["path"], "\n".join(lines[c["start"] - 1 : c["end"]]),
                                  c["start"], c["end"]))
    tp = fp = fn = tn = 0
    by_kind: dict[str, dict[str, int]] = {}
    wrong = []
    marked_uncited = 0
    rules: dict[str, dict[str, int]] = {}
    for n, c in enumerate(cases):
        evidence = (items[n], items[(n + 1) % len(items)])
        for s in c["sentences"]:
            g = ground(s["text"], evidence, "note")
            said = "unsupported" if g.report.unsupported else "supported"
            for j in g.report.judgements:
                r = rules.setdefault(j.rule, {"n": 0, "as_expected": 0})
                r["n"] += 1
                r["as_expected"] += ("supported" if j.supported else "unsupported") == s["expected"]
            if s["kind"] == "uncited" and g.sources:
                marked_uncited += 1
            k = by_kind.setdefault(s["kind"], {"n": 0, "as_expected": 0})
            k["n"] += 1
            k["as_expected"] += said == s["expected"]
            if said == "unsupported":
                tp, fp = (tp + 1, fp) if s["expected"] == "unsupported" else (tp, fp + 1)
            else:
                fn, tn = (fn + 1, tn) if s["expected"] == "unsupported" else (fn, tn + 1)
            if said != s["expected"]:
                wrong.append({"kind": s["kind"], "expected": s["expected"], "text": s["text"]})
    uncited = by_kind.get("uncited", {}).get("n", 0)
    return {
        "sentences": tp + fp + fn + tn,
        "precision_unsupported": tp / (tp + fp) if tp + fp else None,
        "recall_unsupported": tp / (tp + fn) if tp + fn else None,
        "confusion": {"tp": tp, "fp": fp, "fn": fn, "tn": tn},
        "by_kind": by_kind,
        "uncited_given_a_marker": f"{marked_uncited}/{uncited}",
        "wrong": wrong,
        "rules": rules,
    }


def render_markdown(r: dict[str, Any]) -> str:
    o, lab = r["offline"], r["labelled"]
    lines = [
        "# Grounding\n\n",
        f"Offline backend over {o['questions']} questions of `benchmarks/questions.jsonl` "
        f"(index built in {o['index_s']:.0f} s, questions answered in {o['ask_s']:.1f} s):\n\n",
        markdown_table(["measure", "value"], [
            ["answer sentences supported", f"{fmt(o['supported_share'], 3)} ({o['supported']}/{o['sentences']})"],
            ["citations line-exact (cited line shows the quote's start)",
             f"{fmt(o['line_exact_share'], 3)} ({o['line_exact']}/{o['quotes_checked']})"],
            ["citations in the gold file", f"{fmt(o['in_gold_file_share'], 3)} ({o['in_gold_file']}/{o['citations']})"],
            ["citations inside the gold file's relevant span",
             f"{fmt(o['in_gold_span_share'], 3)} ({o['in_gold_span']}/{o['citations']})"],
        ]),
        f"\nLabelled answers ({lab['sentences']} sentences, `benchmarks/grounding_cases.json`): "
        f"the \"unsupported\" verdict has precision {fmt(lab['precision_unsupported'], 3)} and recall "
        f"{fmt(lab['recall_unsupported'], 3)}; uncited copied sentences given a marker: "
        f"{lab['uncited_given_a_marker']}.\n\n",
        markdown_table(["kind", "sentences", "verdict as expected"],
                       [[k, v["n"], v["as_expected"]] for k, v in lab["by_kind"].items()]),
    ]
    if lab["wrong"]:
        lines.append("\nVerdicts that differ from the label:\n\n")
        lines += [f"- {w['kind']} (expected {w['expected']}): {w['text']}\n" for w in lab["wrong"]]
    rc = r["rule_cases"]
    lines += [
        f"\nRule cases ({rc['sentences']} sentences, `benchmarks/grounding_rule_cases.json`: tables, sentences "
        f"joining two pages, invented clauses): precision {fmt(rc['precision_unsupported'], 3)}, recall "
        f"{fmt(rc['recall_unsupported'], 3)}.\n\n",
        markdown_table(["kind", "sentences", "verdict as expected"],
                       [[k, v["n"], v["as_expected"]] for k, v in rc["by_kind"].items()]),
    ]
    if rc["wrong"]:
        lines.append("\nVerdicts that differ from the label:\n\n")
        lines += [f"- {w['kind']} (expected {w['expected']}): {' / '.join(w['text'].splitlines())}\n"
                  for w in rc["wrong"]]
    lines.append("\nVerdicts by the rule that decided them (`crag.grounding.RULES`, then `clauses`, `none`): "
                 "sentences decided, and on the labelled sets the share whose verdict matches the label.\n\n")
    lines.append(rule_table(o, lab, rc))
    return "".join(lines)


def rule_table(o: dict[str, Any], *labelled: dict[str, Any]) -> str:
    from crag.grounding import rule_names

    def cell(part: dict[str, Any], name: str) -> str:
        got = part["rules"].get(name, {"n": 0, "as_expected": 0})
        return f"{fmt(got['as_expected'] / got['n'], 3)} ({got['as_expected']}/{got['n']})" if got["n"] else "-"

    rows = [[f"`{name}`", *(cell(part, name) for part in labelled), o["rules"].get(name, 0)] for name in rule_names()]
    return markdown_table(["rule", "labelled answers: as labelled", "rule cases: as labelled",
                           "offline answers: decided"], rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.grounding", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="only the first 20 questions")
    p.add_argument("--out", type=out_dir, default=None,
                   help="results directory (default: benchmarks/results; a --quick run: a new temporary folder)")
    args = p.parse_args(argv)
    if not (SHARED / "corpora").is_dir():  # before a --quick run's temporary folder is made
        print(f"benchmarks.grounding: the shared corpora are not at {SHARED / 'corpora'} "
              "(CRAG_SHARED=DIR to point elsewhere)", file=sys.stderr)
        return 2
    args.out = quick_out(args.out, args.quick, RESULTS)
    result = {
        "offline": offline_part(20 if args.quick else None),
        "labelled": labelled_part(),
        "rule_cases": labelled_part(RULE_CASES),
        "environment": environment(["crag"]),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "grounding.json", result)
    md = render_markdown(result)
    write_text(args.out / "grounding.md", md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(run_main(main, "python -m benchmarks.grounding"))
