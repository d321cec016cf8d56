"""Grading policies: every rule and threshold beyond the seeds' own, as one frozen record.

The seeds' rule (filter below the drop threshold, mean of the rest against the generate
threshold, none left → ``RE_RETRIEVE``, parse failure → 0.5 each) is not a policy: it always
decides a reply of numbers. A policy adds rules for grades read through token probabilities,
where a small model's habits show (docs/real-models.md, "Grading a real model"):

* ``uninformative``: a probability reading that carries no information (every label a coin
  toss; one label copied down a list of at least ``min_items`` without confidence; one
  probability, not a sure one, for every item) removes nothing and forces no round by itself;
* ``undecided``: an item whose P(yes) lies between the two thresholds is kept but does not
  count in the mean; when no kept item was decided, retrieval's facts choose the action;
* ``first_label``: a batch's first item (the first passage of the prompt, the position a
  small model labels ``no`` whatever it says) read below the drop
  threshold is kept, as ungraded (0.5), unless the grader was sure of its ``no`` (with a drop
  threshold above 0.5 nothing is spared: the seeds' filter removes it);
* ``named_terms``: when the question names a term (``HTTP/3``, ``User Access Token``) that no
  item holds, the first round's evidence does not answer it whatever the grades say: search
  again (``REFINE``) once, where the seeds' arithmetic would have generated.

``seed`` switches every one of them off; ``default`` keeps them (``KB_AGENT_GRADING_POLICY``).
"""

from __future__ import annotations

from attrs import frozen

from ..modes import GradingPolicyName

__all__ = ["DEFAULT", "POLICIES", "SEED", "GradingPolicy", "PolicyName"]


PolicyName = GradingPolicyName  # KB_AGENT_GRADING_POLICY's values


@frozen
class GradingPolicy:
    """The rules beyond the seeds' and their thresholds (see the module doc).

    ``toss_margin``: a P(yes) within this of 0.5 is a coin toss. ``sure``: a label read with at
    least this probability is a sure one. ``min_items``: one label (or one probability) for
    this many items or more can be a copied one; fewer alike is a plausible verdict."""

    name: PolicyName
    uninformative: bool
    undecided: bool
    first_label: bool
    named_terms: bool = False
    toss_margin: float = 0.15
    sure: float = 0.9
    min_items: int = 4


DEFAULT = GradingPolicy(GradingPolicyName.DEFAULT, uninformative=True, undecided=True, first_label=True, named_terms=True)
SEED = GradingPolicy(GradingPolicyName.SEED, uninformative=False, undecided=False, first_label=False, named_terms=False)
POLICIES: dict[PolicyName, GradingPolicy] = {DEFAULT.name: DEFAULT, SEED.name: SEED}
