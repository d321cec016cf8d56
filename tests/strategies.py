"""hypothesis strategies shared by the property tests."""

from __future__ import annotations

from hypothesis import strategies as st

from crag.state import EvidenceItem

score = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
scores = st.lists(score, min_size=0, max_size=12)
threshold = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
tool_name = st.sampled_from(["vector_search", "grep_search", "read_file"])


@st.composite
def evidence_items(draw, min_size: int = 0, max_size: int = 8, tool=tool_name):
    """Distinct evidence items (distinct line spans)."""
    n = draw(st.integers(min_value=min_size, max_value=max_size))
    out = []
    for k in range(n):
        t = draw(tool)
        out.append(
            EvidenceItem(
                tool=t,
                source=f"docs/f{draw(st.integers(0, 3))}.md",
                text=draw(st.text(max_size=40)),
                start_line=k * 10 + 1,
                end_line=k * 10 + 5,
                score=draw(score) if t == "vector_search" else None,
            )
        )
    return out


# Replies a grader (or any node) might send: valid JSON arrays, near misses, and garbage.
grader_reply = st.one_of(
    st.lists(score, max_size=10).map(lambda xs: "[" + ", ".join(map(repr, xs)) + "]"),
    st.lists(st.floats(allow_nan=True, allow_infinity=True), max_size=10).map(str),
    st.text(max_size=80),
    st.sampled_from(["", "[]", "null", '{"scores": [0.9]}', "```json\n[0.5, 0.5]\n```", "[true, false]"]),
)
