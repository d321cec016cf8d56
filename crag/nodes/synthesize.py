"""``synthesize``: write the answer, or say that nothing was found.

* chitchat: one LLM call, answered conversationally, no footer;
* no evidence (all filtered, or nothing retrieved): the fixed sentence, no LLM call;
* otherwise: one LLM call over the evidence numbered [1]..[M]; the answer is grounded
  (``crag.grounding``: each sentence checked against the evidence, markers moved to the
  items and lines that support it, unsupported sentences marked or removed as
  ``KB_AGENT_GROUNDING`` says), markers are renumbered, a footer lists the supporting
  sources, and when the iteration cap forced an answer from evidence the grader did not
  approve, a one-line note says the evidence is weak.

Every answer ends with exactly one usage block; the driver has already added this node's
own call to ``state.usage`` when ``apply`` runs, so the block counts it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrs import evolve

from .. import answer, budget, grading, grounding, prompts
from ..ports import LLMRequest, SynthesizeTask
from ..state import AgentState, Completion, Complexity, GraderAction

if TYPE_CHECKING:
    from . import NodeConfig

NAME = "synthesize"


def _chitchat(state: AgentState) -> bool:
    return state.complexity is Complexity.CHITCHAT and not state.context


def _fit(state: AgentState, cfg: NodeConfig) -> budget.Fitted | None:
    """The answer's prompt within the context budget (lowest-scored items left out first)."""
    if _chitchat(state):
        task = SynthesizeTask(state.question, state.history, (), chitchat=True)
    elif state.context:
        task = SynthesizeTask(state.question, state.history, state.context)
    else:
        return None
    rank = None
    if len(state.evidence_scores) == len(state.context):
        scores = state.evidence_scores
        rank = sorted(range(len(scores)), key=lambda i: (-scores[i], i))
    return budget.fit(task, cfg.max_answer_tokens, cfg.context_tokens, prompts.render, cfg.count_tokens, rank,
                      min_items=1)  # an answer from no evidence at all would be made up


def prepare(state: AgentState, cfg: NodeConfig) -> LLMRequest | None:
    fitted = _fit(state, cfg)
    if fitted is None:
        return None
    return LLMRequest(
        NAME,
        fitted.task,
        fitted.messages,
        max_tokens=cfg.max_answer_tokens,
        temperature=cfg.temperature,
    )


def weak_evidence_note(state: AgentState, cfg: NodeConfig) -> str | None:
    """The note for an answer the iteration cap forced from evidence the grader did not approve."""
    if state.grader_action is None or state.grader_action is GraderAction.GENERATE:
        return None
    if not state.context or state.iteration < cfg.max_iterations:
        return None
    avg = grading.mean(state.evidence_scores) if state.evidence_scores else None
    figure = f"mean relevance {avg:.2f}, " if avg is not None else ""
    return (
        f"_Note: the evidence for this answer is weak ({figure}below {cfg.generate_threshold:g}); "
        f"the search stopped after {state.iteration} retrieval rounds (KB_AGENT_MAX_ITERATIONS)._"
    )


EMPTY_REPLY = answer.EMPTY_REPLY


def apply(state: AgentState, reply: Completion | None, cfg: NodeConfig) -> AgentState:
    if _chitchat(state):
        body = prompts.clean_answer(reply.text) if reply is not None else ""
        text, citations = answer.compose(body or EMPTY_REPLY, (), state.usage, cite=False)
    elif not state.context or reply is None:
        text, citations = answer.compose(answer.NO_EVIDENCE, (), state.usage, cite=False)
    else:
        fitted = _fit(state, cfg)
        if fitted is not None and fitted.dropped:  # left out of the answer's prompt: never cited
            state = evolve(state, audit=state.log("evidence_trimmed", node=NAME, count=len(fitted.dropped)))
        items = fitted.task.items if fitted is not None else state.context  # what the model saw
        return _grounded(state, prompts.clean_answer(reply.text), cfg, items)
    return evolve(state, answer=text, citations=citations)


def _grounded(state: AgentState, body: str, cfg: NodeConfig, items: tuple) -> AgentState:
    """The answer from the model's text, grounded in ``items`` (the evidence its prompt held):
    renumbered, with footer and notes."""
    weak = weak_evidence_note(state, cfg)
    if not body:  # nothing to ground: say so, and list what the model was given
        text, citations = answer.compose(
            f"{EMPTY_REPLY} The evidence it was given: "
            + "".join(f"[{k}]" for k in range(1, len(items) + 1)) + ".",
            items, state.usage, note=weak,
        )
        return evolve(state, answer=text, citations=citations)
    done = grounding.ground(body, items, cfg.grounding, state.question)
    report = done.report if cfg.grounding != "off" else None
    for j in report.judgements if report is not None else ():  # each verdict with the rule that decided it
        state = evolve(state, audit=state.log("sentence_judged", sentence=j.sentence, supported=j.supported,
                                              rule=j.rule))
    if cfg.grounding == "strict" and not done.report.supported:
        text, citations = answer.compose(answer.NO_EVIDENCE, (), state.usage, cite=False)
        return evolve(state, answer=text, citations=citations, grounding=report)
    notes = [n for n in (grounding.note_line(done.report, cfg.grounding), weak) if n]
    text, citations = answer.compose(done.body, done.sources, state.usage, note="\n\n".join(notes) or None)
    return evolve(state, answer=text, citations=citations, grounding=report)
