"""``synthesize``: write the answer, or say that nothing was found.

* chitchat: one LLM call, answered conversationally, no footer;
* no evidence (all filtered, or nothing retrieved): the fixed sentence, no LLM call;
* otherwise: one LLM call over the evidence numbered [1]..[M]; the answer is grounded
  (``crag.grounding``: each sentence checked against the evidence, markers moved to the
  items and lines that support it, unsupported sentences marked or removed as
  ``KB_AGENT_GROUNDING`` says), markers are renumbered, a footer lists the supporting
  sources, and when the iteration cap forced an answer from evidence the grader did not
  approve, a one-line note says the evidence is weak; an answer the server stopped before it
  was finished (its budget, its content filter) keeps its text and a note says it was cut.

An answer the evidence does not hold is not presented as one (``verdict``): when no
informative grade approved the evidence (the simple path asks none; a fast path approves
without one; a grade may carry no information) and grounding finds most of the answer's
judged sentences unsupported, the answer opens by saying that the knowledge base does not
appear to answer the question and keeps only the supported sentences (none: the no-evidence
sentence); ``grounding.verdict`` is ``not_answered``. So it is, whatever the grade, when the
question names a term (``HTTP/3``, ``Terraform``) that no evidence item holds
(``crag.grounding.missing``, audit ``question_terms_missing``). Evidence whose grade carried
no information is named in a note.

A reply with no text at all is asked for once more (``ask_again``; audit ``reply_empty``).

Every answer ends with exactly one usage block; the driver has already added this node's
own call to ``state.usage`` when ``apply`` runs, so the block counts it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from attrs import evolve

from .. import answer, budget, grading, grounding, prompts, searches
from ..errors import UsageError
from ..grounding import verdict
from ..ports import LLMRequest, Step, SynthesizeTask
from ..state import AgentState, Completion, Complexity, EvidenceItem, GradedBy, GraderAction, GroundingReport

if TYPE_CHECKING:
    from . import NodeConfig

NAME = "synthesize"
ASKS_MODEL = True  # listed in the usage block whenever it runs, with 0 calls when it asked none


def _chitchat(state: AgentState) -> bool:
    return state.complexity is Complexity.CHITCHAT and not state.context


def _fit(state: AgentState, cfg: NodeConfig) -> budget.Fitted | None:
    """The answer's prompt within the context budget (lowest-scored items left out first;
    ungraded, the later hits of each call: ``searches.retrieval_rank``), windows of one file
    that share lines shown as one item (``searches.joined``)."""
    members: tuple[tuple[int, ...], ...] = ()
    if _chitchat(state):
        task = SynthesizeTask(state.question, state.history, (), chitchat=True)
    elif state.context:
        items, members = searches.joined(state.context, prompts.ITEM_CHARS)  # shared lines shown once
        task = SynthesizeTask(state.question, state.history, items)
    else:
        return None

    def rank() -> list[int]:  # asked only when items must be left out
        scores = state.evidence_scores
        if state.context and len(scores) == len(state.context):
            order = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
        else:
            order = searches.retrieval_rank(state.context, state.tool_history)  # ungraded: each call's best hits first
        at = {k: n for n, k in enumerate(order)}
        return sorted(range(len(members)), key=lambda j: (min(at[k] for k in members[j]), j))  # a joined item: its best

    return fit_answer(task, cfg, rank)


def fit_answer(task: SynthesizeTask, cfg: NodeConfig, rank: Any = None) -> budget.Fitted:
    """``budget.fit`` of the answer's prompt with the answer's reply budget, at least one item
    kept (an answer from no evidence at all would be made up); a ``UsageError`` also names the
    setting of that budget, which is the user's to lower too."""
    try:
        return budget.fit(task, cfg.max_answer_tokens, cfg.context_tokens, prompts.render, cfg.count_tokens, rank,
                          min_items=1)
    except UsageError as err:
        raise UsageError(f"{err}, or lower KB_AGENT_MAX_ANSWER_TOKENS ({cfg.max_answer_tokens}), the answer's "
                         "reply budget") from None


def prepare(state: AgentState, cfg: NodeConfig) -> Step:
    """The answer's request; its plan is the fitted prompt (the items the model is shown, those
    left out), or None when there is nothing to answer from."""
    fitted = _fit(state, cfg)
    if fitted is None:
        return Step()
    request = LLMRequest(
        NAME,
        fitted.task,
        fitted.messages,
        max_tokens=cfg.max_answer_tokens,
        temperature=cfg.temperature,
    )
    return Step(request, fitted)


UNGRADED_NOTE = (
    "_Note: the grader's scores for this evidence carried no information, so it was not graded; "
    "it is used as retrieval ranked it._"
)


def weak_evidence_note(state: AgentState, cfg: NodeConfig) -> str | None:
    """The note for an answer the iteration cap forced from evidence the grader did not approve."""
    if state.graded_by is GradedBy.UNGRADED:
        return UNGRADED_NOTE
    if state.grader_action is None or state.grader_action is GraderAction.GENERATE:
        return None
    if not state.context or state.iteration < cfg.max_iterations:
        return None
    rounds = f"{state.iteration} retrieval round{'s' if state.iteration != 1 else ''}"
    if state.graded_by is GradedBy.PARSE_FAILURE:  # every item has the default score: nothing was measured
        return (
            "_Note: the evidence for this answer is weak (the grader's reply could not be read, so it was "
            "not graded); "
            f"the search stopped after {rounds} (KB_AGENT_MAX_ITERATIONS)._"
        )
    avg = grading.mean(state.evidence_scores) if state.evidence_scores else None
    if avg is not None and avg >= cfg.generate_threshold - grading.EPS:  # a policy row asked for more, not the mean
        return (f"_Note: the search stopped after {rounds} (KB_AGENT_MAX_ITERATIONS) while the grader still "
                "asked for more evidence._")
    figure = f"mean relevance {avg:.2f}, " if avg is not None else ""
    return (
        f"_Note: the evidence for this answer is weak ({figure}below {cfg.generate_threshold:g}); "
        f"the search stopped after {rounds} (KB_AGENT_MAX_ITERATIONS)._"
    )


EMPTY_REPLY = answer.EMPTY_REPLY

FILTERED_NOTE = "_Note: the server's content filter stopped this answer before it was finished._"


def stopped_note(step: Step, reply: Completion | None, window: int | None = None) -> str | None:
    """The note for an answer the server stopped before it was finished: by its budget
    (``finish_reason`` ``length``) or by its content filter; what was written stays, said to be cut.
    A budget that is half the ``window`` the server's refusals left (``crag.driver``) is that
    window's, not the setting's: raising the setting would change nothing."""
    if reply is None:
        return None
    if reply.finish_reason == "content_filter":
        return FILTERED_NOTE
    if reply.truncated and step.request is not None:
        tokens = step.request.max_tokens
        why = (f", half of the model's context window on the server ({window} tokens)"
               if window is not None and tokens == window // 2 else " (KB_AGENT_MAX_ANSWER_TOKENS)")
        return f"_Note: the answer was cut short at its budget of {tokens} tokens{why}._"
    return None


def ask_again(step: Step, reply: Completion) -> bool:
    """Whether the driver asks for the answer once more: the server finished the reply as
    usual (not cut by its budget, refused or filtered) and it holds no text at all once its
    think blocks are removed, or only citation markers ("[1][2][3]", no word or number).
    Qwen2.5-Coder-1.5B returns an empty answer about once in sixty
    questions, and asked again it answers; the user would otherwise read that the model
    returned no answer text. Nothing of an empty reply was shown while it streamed, so the
    second reply streams as the first would have."""
    fitted: budget.Fitted | None = step.plan
    if fitted is None or reply.truncated or reply.refused or reply.finish_reason == "content_filter":
        return False
    return not _says_anything(prompts.clean_answer(reply.text))


def apply(state: AgentState, step: Step, reply: Completion | None, cfg: NodeConfig) -> AgentState:
    fitted: budget.Fitted | None = step.plan
    stopped = stopped_note(step, reply, state.context_window)
    if fitted is not None and fitted.history_dropped:  # the oldest turns did not fit the window
        state = evolve(state, audit=state.log("history_trimmed", node=NAME, count=fitted.history_dropped))
    if fitted is not None and fitted.task.chitchat:
        # No evidence, so no citation: markers and a source list the model wrote go (SPEC §7).
        body = answer.without_citations(prompts.clean_answer(reply.text)) if reply is not None else ""
        text, citations = answer.compose(body or EMPTY_REPLY, (), state.usage, note=stopped, cite=False)
    elif fitted is None or reply is None:
        text, citations = answer.compose(answer.NO_EVIDENCE, (), state.usage, cite=False)
    else:
        if fitted.dropped:  # left out of the answer's prompt: never cited
            state = evolve(state, audit=state.log("evidence_trimmed", node=NAME, count=len(fitted.dropped)))
        items = fitted.task.items  # what the model saw
        body = prompts.without_echo(prompts.clean_answer(reply.text), fitted.task.question)  # as the prompt said it
        return _grounded(state, body, cfg, items, stopped)
    return evolve(state, answer=text, citations=citations)


def asked(state: AgentState, items: tuple[EvidenceItem, ...]) -> str:
    """What grounding holds ``items`` to: the question as it was searched (a follow-up with no
    word of its own, "why?", read with the question it follows: ``searches.searched_question``)
    without the paths it names of their own files (``crag.grounding.unpointed``: the user
    pointed at the source)."""
    question = searches.searched_question(state.question, state.history)
    return grounding.unpointed(question, [item.source for item in items])


def _says_anything(body: str) -> bool:
    """Whether a reply holds a word or a number beside its markers ("[1] [2] [3]" does not)."""
    return any(ch.isalnum() for ch in answer.renumber(body, 0)[0])


def _grounded(state: AgentState, body: str, cfg: NodeConfig, items: tuple, stopped: str | None = None) -> AgentState:
    """The answer from the model's text, grounded in ``items`` (the evidence its prompt held):
    renumbered, with footer and notes (``stopped``: the server stopped the reply, ``stopped_note``)."""
    after = "\n\n".join(n for n in (stopped, weak_evidence_note(state, cfg)) if n) or None
    if not _says_anything(body):  # nothing to ground: say so, and list what the model was given
        text, citations = answer.compose(
            f"{EMPTY_REPLY} The evidence it was given: "
            + "".join(f"[{k}]" for k in range(1, len(items) + 1)) + ".",
            items, state.usage, note=after,
        )
        return evolve(state, answer=text, citations=citations)
    question = asked(state, items)
    absent = grounding.missing(question, [item.text for item in items])
    done = grounding.ground(body, items, cfg.grounding, question, absent)
    if cfg.grounding == "off":
        text, citations = answer.compose(done.body, done.sources, state.usage, note=after)
        return evolve(state, answer=text, citations=citations)
    for j in done.report.judgements:  # each verdict with the rule that decided it
        state = evolve(state, audit=state.log("sentence_judged", sentence=j.sentence, supported=j.supported,
                                              rule=j.rule))
    if absent:
        state = evolve(state, audit=state.log("question_terms_missing", terms=absent))
    chosen = grounding.cited(done.sources, items)
    passages = [item.text for item in chosen]
    # the offline answer quotes the passages sharing the most words with the question: one
    # shared word says nothing of what they are about (docs/grounding.md)
    quotes = answer.quotes_only(body)
    addressed = grounding.addresses(question, passages, grounding.QUOTES_FOCUS_SHARE if quotes else grounding.FOCUS_SHARE)
    if not addressed and done.report.supported:
        rule = ("negation" if not grounding.negation_held(question, passages)  # which test it failed
                else "opposite" if grounding.opposed(question, passages) else "focus")
        state = evolve(state, audit=state.log("question_not_addressed", rule=rule))
    restated = addressed and grounding.says_nothing_new(
        question, [j.sentence for j in done.report.judgements if j.supported])
    if restated:
        state = evolve(state, audit=state.log("answer_restates_question"))
        addressed = False
    held = addressed and grounding.holds_focus(question, chosen)
    judged = verdict_of(done.report, state, absent, addressed, held)
    report = evolve(done.report, verdict=judged)
    if judged == "not_answered" and cfg.grounding != "strict":
        done = grounding.ground(body, items, "strict", question, absent)  # only the supported sentences
    if (cfg.grounding == "strict" or judged == "not_answered") and not done.report.supported:
        text, citations = answer.compose(answer.NO_EVIDENCE, (), state.usage, cite=False)
        return evolve(state, answer=text, citations=citations, grounding=report)
    opening = (answer.NOT_MENTIONED.format(terms=" or ".join(absent)) if absent
               else answer.ONLY_RESTATED if restated
               else answer.NOT_ADDRESSED if report.supported and not addressed else answer.NOT_ANSWERED)
    body = f"{opening}\n\n{done.body}" if judged == "not_answered" else done.body
    removed = judged == "not_answered"  # the opening says so: no count of tagged sentences
    # SPEC §7: the body ends with the line counting the unsupported sentences, after any other note
    notes = [n for n in (after, None if removed else grounding.note_line(done.report, cfg.grounding)) if n]
    text, citations = answer.compose(body, done.sources, state.usage, note="\n\n".join(notes) or None)
    return evolve(state, answer=text, citations=citations, grounding=report)


def verdict_of(report: GroundingReport, state: AgentState, absent: list[str] | tuple[str, ...] = (),
               addressed: bool = True, held: bool = False) -> str | None:
    """The answer's verdict on ``report`` (``crag.grounding.verdict.judge``)."""
    found = verdict.judge(report, state.graded_by is GradedBy.GRADER, absent, addressed, held)
    return None if found is None else found.value


def verdict_may_rewrite(state: AgentState, items: tuple[EvidenceItem, ...]) -> bool:
    """Whether the verdict may be ``not_answered``, which replaces the answer's opening, for an
    answer written from ``items`` (``crag.grounding.verdict.may_rewrite``). Known before the
    answer is written, so a stream holds the grounded answer back until it is finished."""
    absent = grounding.missing(asked(state, items), [item.text for item in items])
    return verdict.may_rewrite(state.graded_by is GradedBy.GRADER, absent)
