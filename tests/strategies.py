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


# Hostile alphabets: what documents, file names, .env files and servers may hold.
HOSTILE_CHARS = [
    "\n", "\r", "\t", "\x00", "\x07", "\x08", "\x1b", "\x7f", "\x9b", "\x9d", "\u202e", "\u2066", "\ufeff",
    "[", "]", ";", "=", "#", "'", '"', "\\", " ", "é", "ß", "日", "本", "Ж", "ع", "📊", "*", "-", ":",
]
hostile_text = st.text(
    alphabet=st.one_of(st.sampled_from(HOSTILE_CHARS), st.characters(codec="utf-8"), st.sampled_from("abcxyz019")),
    max_size=40,
)
# ANSI/OSC sequences are more likely to be drawn whole than built character by character.
ESCAPES = ["\x1b[31m", "\x1b[2J", "\x1b]0;title\x07", "\x1b]8;;http://x\x1b\\", "\x9b1m", "\x1bP+q\x1b\\"]
hostile_reply = st.lists(st.one_of(hostile_text, st.sampled_from(ESCAPES)), max_size=5).map("".join)


def _name_ok(raw: bytes) -> bool:
    return b"/" not in raw and b"\x00" not in raw and raw not in (b".", b"..") and not raw.startswith(b".")


# File names of any bytes (not UTF-8 included); the suffix makes discovery consider them.
hostile_file_name = st.one_of(
    st.binary(min_size=1, max_size=16),
    hostile_text.map(lambda t: t.encode("utf-8")),
).filter(_name_ok).map(lambda raw: raw[:200] + b".md")


@st.composite
def hostile_dotenv(draw, secret_var: str = "OPENAI_API_KEY") -> bytes:
    """The bytes of a ``.env``: known keys with hostile values, a BOM, garbage lines, raw bytes."""
    keys = st.sampled_from(["KB_AGENT_MODEL", "KB_AGENT_TOP_K", "KB_AGENT_LLM_TIMEOUT", "KB_AGENT_MAX_ITERATIONS",
                            "KB_AGENT_GROUNDING", "JIRA_API_TOKEN", "OPENAI_API_KEY", "KB_AGENT_WEB_FETCH", "X"])
    lines = draw(st.lists(st.tuples(keys, st.one_of(hostile_text, st.binary(max_size=20).map(
        lambda b: b.decode("latin-1")))), max_size=4))
    body = "\n".join(f"{k}={v}" for k, v in lines).encode("utf-8", "surrogateescape")
    prefix = draw(st.sampled_from([b"", b"\xef\xbb\xbf", b"\xff\xfe", b"export "]))
    return prefix + body


# Small folder trees with .gitignore files, for comparing crag's ignore rules with git's.
# Names hold what gitignore treats specially (#, !, spaces, brackets, stars, backslashes,
# non-ASCII); patterns are built from the tree's own paths so that they often match.
_FOLDERS = ["a", "b", "ab", "d", "A", "c d", "#a", "!a", "[a]", "a\\b", "a ", "é"]
_STEMS = ["a", "b", "ab", "ba", "A", "x", "c d", "#a", "!a", "a ", "[a]", "a*", "a?", "a\\b", "é", "ée", "**"]
_CLASSES = ["[a-c]", "[!a]", "[^b]", "[[:alpha:]]", "[]a]", "[a-]", "[[:digit:]ab]", "[A-Z]", "[!/]", "[a/b]", "[é]"]


def _escaped(component: str) -> str:
    out = "".join("\\" + ch if ch in "\\[*?" else ch for ch in component)
    out = "\\" + out if out[:1] in ("#", "!") else out
    return out[:-1] + "\\ " if out.endswith(" ") else out


@st.composite
def _component_pattern(draw, component: str) -> str:
    kind = draw(st.integers(0, 9))
    if kind <= 2:
        return _escaped(component)
    if kind == 3:
        return component
    if kind == 4:
        return draw(st.sampled_from(["*", "**", "?*", "*?", "***"]))
    if kind == 5:
        return component[0] + draw(st.sampled_from(["*", "**", "?"]))
    if kind == 6:
        return "*" + _escaped(component[-1:])
    if kind == 7:
        return draw(st.sampled_from(_CLASSES)) + draw(st.sampled_from(["", "*", "?", ".md"]))
    if kind == 8:
        return "?" * len(component)
    return "**"


@st.composite
def _ignore_line(draw, paths: list[str]) -> str:
    parts = draw(st.sampled_from(paths)).split("/")
    first = draw(st.integers(0, len(parts) - 1))
    last = draw(st.integers(first + 1, len(parts)))
    pattern = draw(st.sampled_from(["/", "\\/"])).join(draw(_component_pattern(c)) for c in parts[first:last])
    if draw(st.booleans()):
        pattern = draw(st.sampled_from(["/", "**/", "/**/"])) + pattern
    pattern += draw(st.sampled_from(["", "", "", "/", "/**", "/*"]))
    if draw(st.integers(0, 3)) == 0:
        pattern = "!" + pattern
    return pattern + draw(st.sampled_from(["", "", "", " ", "  ", "\\ ", "\t", "\r"]))


@st.composite
def ignore_trees(draw) -> tuple[list[str], list[str], dict[str, list[str]]]:
    """(folders, files, {folder: .gitignore lines}); paths are relative, ``/``-separated."""
    folders = [""]
    for _ in range(draw(st.integers(0, 5))):
        parent = draw(st.sampled_from(folders))
        if parent.count("/") < 2:
            folders.append((parent + "/" if parent else "") + draw(st.sampled_from(_FOLDERS)))
    folders = sorted(set(folders))
    files = sorted({(folder + "/" if folder else "") + stem + ".md"
                    for folder, stem in draw(st.lists(st.tuples(st.sampled_from(folders), st.sampled_from(_STEMS)),
                                                      min_size=1, max_size=10))})
    paths = files + [f for f in folders if f]
    ignores: dict[str, list[str]] = {}
    for folder in folders:
        below = [p[len(folder) + 1:] if folder else p for p in paths if not folder or p.startswith(folder + "/")]
        if below and draw(st.booleans()):
            ignores[folder] = draw(st.lists(_ignore_line(below), min_size=1, max_size=5))
    return folders, files, ignores
