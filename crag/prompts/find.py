"""What a question names: Jira keys, URLs, Confluence page ids, file paths, identifiers.

Pure functions of text, in order of appearance, without repeats; none raises. The planner
may only call a remote tool with an argument found here in the user's own question.
"""

from __future__ import annotations

import re

__all__ = [
    "NOT_JIRA_PROJECTS",
    "find_confluence_page_ids",
    "find_identifiers",
    "find_jira_keys",
    "find_paths",
    "find_urls",
]

# Upper-case tokens followed by -digits that are standards, models or encodings, not Jira keys.
NOT_JIRA_PROJECTS = frozenset(
    """
    UTF UCS ISO IEC IEEE ANSI ASCII ECMA RFC BCP STD PEP JSR JEP KIP FIPS NIST CVE CWE CAPEC
    GPT BERT LLAMA CLAUDE GEMINI MISTRAL QWEN PHI OPUS SONNET HAIKU DALLE WHISPER YOLO T5
    SHA MD RIPEMD CRC AES DES RSA ECDSA ED HMAC PBKDF TLS SSL HTTP HTTPS SMTP IMAP POP
    TCP UDP IP IPV DNS SSH FTP RTP SIP VLAN WPA WEP SMB NFS SQL JDK JRE JVM API SDK CPU GPU
    COVID SARS MERS HIV HPV H1N1 PM CO NO SO
    USB PCI PCIE DDR LPDDR GDDR HDMI LTE NR RJ CAT DVI VGA SATA NVME M2 MPEG MP JPEG PNG AVC HEVC
    WIN WINDOWS MACOS IOS ANDROID RHEL CENTOS UBUNTU DEBIAN FEDORA ARM ARMV X86 AMD INTEL
    CP IBM KOI BASE BIG ES ECMASCRIPT PY PYTHON JAVA NODE IE
    TOP NUMBER NO NR REV VER V VERSION PAGE STEP PHASE TIER LEVEL SIZE AGE
    A B C D E F G H I J K L M N O P Q R S T U W X Y Z
    """.split()
)

_JIRA = re.compile(
    r"(?<![A-Za-z0-9_\-.])([A-Z][A-Z0-9_]{1,19})-([1-9][0-9]{0,6})(?![A-Za-z0-9_]|[-.][0-9])"
)
_URL = re.compile(r"(?<![A-Za-z0-9+.-])https?://[^\s\x00-\x1f\x7f-\x9f<>\"'`\u3000-\u303f\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65]+", re.I)
_URL_TRAILING = ".,;:!?'\"*_~"
_CONFLUENCE_PATTERNS = (
    re.compile(r"[?&]pageId=([0-9]{1,20})(?![0-9])", re.I),
    re.compile(r"/pages/(?:viewpage\.action\?pageId=)?([0-9]{1,20})(?![0-9])", re.I),
    re.compile(
        r"(?<![A-Za-z0-9_])page[ \t_-]?id[ \t]*(?:[:=#]|is)?[ \t]*\"?([0-9]{1,20})(?![0-9])", re.I
    ),
    re.compile(r"(?<![A-Za-z0-9_])confluence(?:[ \t]+page)?[ \t]*(?:[:=#]|id)?[ \t]*([0-9]{3,20})(?![0-9])", re.I),
    re.compile(r"(?<![A-Za-z0-9_])page[ \t]*[:#]?[ \t]*([0-9]{5,20})(?![0-9])", re.I),
)


def find_jira_keys(text: str) -> tuple[str, ...]:
    """Jira issue keys (``ABC-123``) in ``text``, in order, without repeats.

    A project key has at least two characters; standards and names like UTF-8, GPT-4,
    ISO-8601 or SHA-256 are not keys. Works next to any non-Latin text (``FSR-123的状态``).
    """
    if not isinstance(text, str):
        return ()
    keys: list[str] = []
    for match in _JIRA.finditer(text):
        project = match.group(1)
        if project in NOT_JIRA_PROJECTS or project.endswith("_") or "__" in project:
            continue
        key = f"{project}-{match.group(2)}"
        if key not in keys:
            keys.append(key)
    return tuple(keys)


def _trim_url(url: str) -> str:
    while url and url[-1] in _URL_TRAILING:
        url = url[:-1]
    for opening, closing in (("(", ")"), ("[", "]"), ("{", "}")):
        while url.endswith(closing) and url.count(closing) > url.count(opening):
            url = url[:-1]
            while url and url[-1] in _URL_TRAILING:
                url = url[:-1]
    return url


def find_urls(text: str) -> tuple[str, ...]:
    """``http(s)://`` URLs in ``text``, in order, without trailing punctuation or repeats."""
    if not isinstance(text, str):
        return ()
    urls: list[str] = []
    for match in _URL.finditer(text):
        url = _trim_url(match.group(0))
        if re.match(r"https?://[^/?#\s]+", url, re.I) and url not in urls:
            urls.append(url)
    return tuple(urls)


def find_confluence_page_ids(text: str) -> tuple[str, ...]:
    """Confluence page ids in ``text``: ``pageId=123456``, ``.../pages/123456/...`` URLs,
    ``page id 42``, ``Confluence page 1234``, ``page 123456`` (five digits or more)."""
    if not isinstance(text, str):
        return ()
    found: list[tuple[int, str]] = []
    for pattern in _CONFLUENCE_PATTERNS:
        for match in pattern.finditer(text):
            found.append((match.start(1), match.group(1).lstrip("0") or "0"))
    ids: list[str] = []
    for _, page_id in sorted(found):
        if page_id not in ids:
            ids.append(page_id)
    return tuple(ids)


def confluence_mentions(text: str) -> tuple[tuple[str, str], ...]:
    """Where ``text`` designates a Confluence page (``find_confluence_page_ids``' forms): each
    as (the words that designate it, "Confluence page 1234" or a URL's ``pageId=1234``, and
    the page id)."""
    if not isinstance(text, str):
        return ()
    found = {(m.start(), m.group(0), m.group(1).lstrip("0") or "0") for p in _CONFLUENCE_PATTERNS for m in p.finditer(text)}
    return tuple((said, page) for _, said, page in sorted(found))


# The suffixes of the files crag indexes (its documents, PDF and DOCX, included): a question
# naming one names where its answer is.
_PATH_EXTENSIONS = (
    "md|markdown|mdx|mdown|mkd|txt|text|rst|adoc|asciidoc|org|tex|pdf|docx|xhtml|ipynb|py|pyi|js|jsx|ts|tsx|json|jsonl|yaml|yml|toml|ini|cfg|conf|"
    "env|sh|bash|zsh|ps1|go|rs|java|kt|kts|scala|rb|php|c|h|cc|cpp|hpp|cs|swift|sql|html|htm|css|"
    "scss|xml|csv|tsv|lock|gradle|properties|proto|graphql|tf|hcl|dockerfile|mk|log"
)
_PATH = re.compile(
    r"(?<![\w/.\\-])((?:~|\.{1,2})?/?(?:[\w.-]+/)*[\w-][\w.-]*\.(?:" + _PATH_EXTENSIONS + r"))(?![\w/-])"
    r"|(?<![\w/.\\-])((?:[\w.-]+/)*(?:Makefile|Dockerfile|Containerfile|Jenkinsfile|Procfile|README|LICENSE|CHANGELOG))(?![\w./-])",
    re.I,
)
_IDENTIFIER_PATTERNS = (
    re.compile(r"`([^`\n]{2,80})`"),
    re.compile(r"\"([^\"\n]{2,80})\"|\u201c([^\u201d\n]{2,80})\u201d"),
    re.compile(r"(?<![\w-])(--[A-Za-z][\w-]*)"),
    re.compile(r"(?<![\w.])([A-Za-z][A-Za-z0-9]*(?:_[A-Za-z0-9]+)+)(?![\w])"),
    re.compile(r"(?<![\w.])([A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)+)(?![\w])"),
    re.compile(r"(?<![\w.])([a-z][a-z0-9]*(?:[A-Z][a-z0-9]*)+)(?![\w])"),
    re.compile(r"(?<![\w.])([A-Za-z_][\w]*(?:\.[A-Za-z_][\w]*)*\(\))"),
    re.compile(r"(?<![\w.])([a-z_]\w+(?:\.[a-z_]\w+)+)(?![\w(])"),
)


def find_paths(text: str) -> tuple[str, ...]:
    """File paths named in ``text`` (``docs/setup.md``, ``./run.sh``, ``Makefile``), URLs excluded."""
    if not isinstance(text, str):
        return ()
    for url in find_urls(text):
        text = text.replace(url, " ")
    paths: list[str] = []
    for match in _PATH.finditer(text):
        path = match.group(1) or match.group(2)
        if path and path not in paths:
            paths.append(path)
    return tuple(paths)


def find_identifiers(text: str) -> tuple[str, ...]:
    """Code-like tokens worth a literal search: backticked or quoted strings, ``--flags``,
    ``snake_case`` and ``ENV_VARS``, ``CamelCase``, ``lowerCamel``, ``call()``, ``dotted.names``.
    Paths, URLs and Jira keys are not identifiers."""
    if not isinstance(text, str):
        return ()
    excluded = set(find_paths(text)) | set(find_jira_keys(text))
    for url in find_urls(text):
        text = text.replace(url, " ")
    found: list[tuple[int, int, str]] = []  # (position, -length, token): longest first at a position
    for pattern in _IDENTIFIER_PATTERNS:
        for match in pattern.finditer(text):
            group = next((i for i in range(1, (match.lastindex or 0) + 1) if match.group(i)), None)
            if group is None:
                continue
            token = match.group(group).strip()
            if token and token not in excluded and not any(token in p for p in excluded):
                found.append((match.start(group), -len(token), token))
    out: list[str] = []
    for _, _, token in sorted(found):
        if token not in out and not any(token in other and token != other for other in out):
            out.append(token)
    return tuple(out)
