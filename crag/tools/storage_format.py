"""Confluence's storage format (the XHTML of ``body.storage``) read as text, for ``confluence_fetch``.

What the page shows is kept and what only configures it goes:

* the body of a ``code`` or ``noformat`` macro (``<ac:plain-text-body><![CDATA[...]]>``) is a
  fenced code block, its lines as they are, with the ``language`` parameter on the fence;
* a link's text (``<ac:plain-text-link-body>``, ``<ac:link-body>``); a link without one reads as
  what it links to, as Confluence shows it: a page's or blog post's title, an attachment's file
  name, a user as ``@`` and the user name (else the account id), a space's key, a URL;
* ``<time datetime="2025-03-14" />`` is its date;
* a macro's parameters (``<ac:parameter>``) are left out, but for those the page shows: a
  ``title`` (a status lozenge's text, a panel's or an expand's heading) and a ``jira`` macro's
  issue ``key``;
* a code body or a parameter left open ends with its macro (nothing after it is swallowed).

Every other element is read as ``crag.tools.http.html_to_text`` reads HTML.
"""

from __future__ import annotations

import html
import re

from .http import TextExtractor, html_to_text

__all__ = ["storage_to_text"]

_CODE_MACROS = ("code", "noformat")
# What a link with no text of its own shows, by the resource it names: (tag, attributes in order).
_LINK_TARGETS = {
    "ri:page": ("ri:content-title",),
    "ri:blog-post": ("ri:content-title",),
    "ri:attachment": ("ri:filename",),
    "ri:user": ("ri:username", "ri:account-id", "ri:userkey"),
    "ri:space": ("ri:space-key",),
    "ri:url": ("ri:value",),
}
_LINK_BODIES = ("ac:plain-text-link-body", "ac:link-body")
# Parameters the page shows, by name: the macros they are shown for (None: any macro).
_SHOWN_PARAMETERS: dict[str, tuple[str, ...] | None] = {"title": None, "key": ("jira",)}
_INLINE_MACROS = ("status", "jira")  # shown within the line, not as a line of their own


def storage_to_text(storage: str) -> str:
    """The text of a page's storage-format body (see the module docstring)."""
    return html_to_text(_cdata_as_text(storage), _StorageExtractor())[1]


def _cdata_as_text(storage: str) -> str:
    """``storage`` with each ``<![CDATA[...]]>`` section written as the (escaped) text it holds:
    ``html.parser`` drops such sections. One that never ends is left as it is (in one pass)."""
    out: list[str] = []
    at = 0
    while (start := storage.find("<![CDATA[", at)) != -1:
        end = storage.find("]]>", start + 9)
        if end == -1:
            break
        out += [storage[at:start], html.escape(storage[start + 9 : end], quote=False)]
        at = end + 3
    return "".join(out) + storage[at:]


class _StorageExtractor(TextExtractor):
    def __init__(self) -> None:
        super().__init__()
        self._macros: list[str] = []  # the names of the macros the parser is in, innermost last
        self._language = ""
        self._parameter: list[str] | None = None  # the text of the parameter being read
        self._parameter_name = ""
        self._code: list[str] | None = None  # the body of the code macro being read
        self._link: list[str] | None = None  # what the link being read names (no text of its own yet)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if ":" not in tag and tag != "time":  # HTML's own elements, most of a page
            super().handle_starttag(tag, attrs)
            return
        named = {k: v for k, v in attrs if v}
        if tag == "ac:structured-macro":
            self._macros.append(named.get("ac:name", "").lower())
            if self._macros[-1] in _CODE_MACROS:
                self._language = ""
        elif tag == "ac:parameter":
            self._parameter, self._parameter_name = [], named.get("ac:name", "").lower()
        elif tag == "ac:plain-text-body" and self._in_code_macro():
            self._code = []
        elif tag == "ac:link":
            self._link = []
        elif tag in _LINK_BODIES:
            self._link = None  # the link has text of its own
        elif tag in _LINK_TARGETS and self._link is not None:
            self._link += [named[name] for name in _LINK_TARGETS[tag] if named.get(name)][:1]
            if self._link and tag == "ri:user":
                self._link[-1] = "@" + self._link[-1]
        elif tag == "time" and named.get("datetime"):
            self.handle_data(named["datetime"])
        else:
            super().handle_starttag(tag, attrs)

    def handle_endtag(self, tag: str) -> None:
        if ":" not in tag and tag != "time":
            super().handle_endtag(tag)
        elif tag == "ac:structured-macro":
            self._parameter = None  # one left open ends with its macro
            if self._code is not None:
                self._fence("".join(self._code))
                self._code = None
            if self._macros:
                self._macros.pop()
        elif tag == "ac:parameter":
            self._end_parameter()
        elif tag == "ac:plain-text-body" and self._code is not None:
            self._fence("".join(self._code))
            self._code = None
        elif tag == "ac:link":
            if self._link:
                self.handle_data(" ".join(self._link[0].split()))
            self._link = None

    def handle_data(self, data: str) -> None:
        if self._parameter is not None:
            self._parameter.append(data)
        elif self._code is not None:
            self._code.append(data)
        else:
            super().handle_data(data)

    def _end_parameter(self) -> None:
        if self._parameter is None:
            return
        text, self._parameter = " ".join("".join(self._parameter).split()), None
        macro = self._macros[-1] if self._macros else ""
        if self._parameter_name == "language" and self._in_code_macro():
            self._language = re.sub(r"[^\w#+.-]", "", text)[:40]
        elif text and self._parameter_name in _SHOWN_PARAMETERS:
            shown_for = _SHOWN_PARAMETERS[self._parameter_name]
            if shown_for is None or macro in shown_for:
                if macro in _INLINE_MACROS:
                    self.handle_data(text)
                else:
                    self.parts.append("\n")
                    self.handle_data(text)
                    self.parts.append("\n")

    def _in_code_macro(self) -> bool:
        return bool(self._macros) and self._macros[-1] in _CODE_MACROS

    def _fence(self, code: str) -> None:
        code = code.replace("\r\n", "\n").replace("\r", "\n").strip("\n")
        fence = "```"
        while fence in code:
            fence += "`"
        self.parts.append("\n")
        self.verbatim.append(len(self.parts))
        self.parts += [f"{fence}{self._language}\n{code}\n{fence}", "\n"]
