"""What looks like a mistake in crag's configuration but does not stop it
(``crag.config.config_warnings``): ``.env`` lines that are not assignments, ``KB_AGENT_*``
names crag does not know."""

from __future__ import annotations

import os
from collections.abc import Mapping

from .environment import read_dotenv
from .errors import ConfigError

WARNINGS_SHOWN = 20  # of each kind; the rest are counted in one more line


def setting_warnings(known: list[str], environ: Mapping[str, str] | None = None,
                     dotenv: str | os.PathLike[str] | None = ".env") -> list[str]:
    """What looks like a mistake in the configuration but does not stop crag: ``.env`` lines
    that are not assignments, and ``KB_AGENT_*`` names crag does not know (with the closest
    known name, of ``known``). Never shows a value. At most ``WARNINGS_SHOWN`` of each kind are listed and
    looked up, the rest counted: a ``.env`` of 30,000 unknown names costs 20 look-ups."""
    from .safe_text import short_value

    known_set = frozenset(known)
    env = os.environ if environ is None else environ
    found: list[str] = []
    bad_lines: list[tuple[int, str]] = []
    try:
        file_values = read_dotenv(dotenv, bad_lines) if dotenv else {}
    except ConfigError:
        file_values = {}  # Settings.from_env reports it
    where = os.fspath(dotenv) if dotenv else ".env"
    if dotenv and os.path.isdir(dotenv) and not os.path.isfile(os.path.join(dotenv, "pyvenv.cfg")):
        found.append(f"{where} is a folder, not a settings file; no settings are read from it")
    target = _missing_target(dotenv) if dotenv else None
    if target is not None:
        found.append(f"{where} is a symbolic link to {target}, which does not exist; no settings are read from it")
    for number, name in bad_lines[:WARNINGS_SHOWN]:  # the hint names a setting, never the line's text
        close = closest_setting(name.upper(), known, cutoff=0.8) if 5 <= len(name) <= 100 else []
        found.append(f"{where} line {number} is not an assignment (NAME=value); it is ignored" + "".join(f"; did you mean {c}=...?" for c in close))
    if len(bad_lines) > WARNINGS_SHOWN:
        found.append(f"{len(bad_lines) - WARNINGS_SHOWN:,} more lines of {where} are not assignments; they are ignored")
    # Any case and stray spaces count: kb_agent_top_k and "KB_AGENT_TOP_K " are typos of a setting too.
    unknown = [(name, origin) for origin, names in ((where, file_values), ("the environment", env))
               for name in sorted(names) if name.strip().upper().startswith("KB_AGENT_") and name not in known_set]
    for name, origin in unknown[:WARNINGS_SHOWN]:
        close = closest_setting(name.strip().upper(), known) if len(name) <= 100 else []
        hint = f"; did you mean {close[0]}?" if close else ""
        shown = short_value(name, 100)
        shown = f'"{shown}"' if name != name.strip() else shown  # the stray space made visible
        found.append(f"{shown} (in {origin}) is not a crag setting{hint}")
    if len(unknown) > WARNINGS_SHOWN:
        found.append(f"{len(unknown) - WARNINGS_SHOWN:,} more KB_AGENT_* names are not crag settings")
    unread = _project_dotenv(known_set, env) if dotenv and os.fspath(dotenv) == ".env" else None
    return [*found, unread] if unread else found


def _project_dotenv(known: frozenset[str], env: Mapping[str, str]) -> str | None:
    """A warning when the working folder has no ``.env`` but the project folder above it, whose
    ``.crag`` is the index found (``find_index_dir``), has one setting crag's variables: only the
    working folder's is read (SPEC §3), so a subfolder ran with other settings than the project,
    without a word (the offline backend for the model; the index "built with another embedder",
    and advised to be rebuilt with this one). So too a ``.env`` nearer than that index (or above
    a folder with none) that says where the index is: a subfolder used another index, or made a
    second one in its own ``.crag``. Names, never values, are shown."""
    from .environment import find_index_dir
    from .safe_text import display_name

    if os.path.lexists(".env") or env.get("KB_AGENT_INDEX_DIR", "").strip():
        return None
    index = find_index_dir()
    if not os.path.isabs(index) and os.path.lexists(os.path.join(index, "CURRENT")):
        return None  # the index is in the working folder
    project = _dotenv_placing_index(os.path.dirname(index) if os.path.isabs(index) else None, env)
    if project is None:
        return None
    try:
        names = [name for name in read_dotenv(os.path.join(project, ".env")) if name in known and name not in env]
    except (ConfigError, OSError):
        return None
    if not names:
        return None
    listed = ", ".join(names[:3]) + (f" and {len(names) - 3:,} more" if len(names) > 3 else "")
    return (f"{display_name(os.path.join(project, '.env'))} is not read here, only the working folder's .env is: "
            f"its {listed} {'is' if len(names) == 1 else 'are'} not used; run crag in {display_name(project)}, "
            "or set them in the environment")


def _dotenv_placing_index(project: str | None, env: Mapping[str, str]) -> str | None:
    """The folder above the working one, nearer than ``project`` (that of the index found, or
    the filesystem's root with none), whose ``.env`` says where the index is: its
    ``KB_AGENT_INDEX_DIR`` or ``KB_AGENT_STORE`` would have chosen another index than the one
    found (or ``./.crag``, which ``crag index`` would create beside the project's); else
    ``project``. A name left empty says nothing (``.crag``, as unset)."""
    folder = os.path.dirname(os.getcwd())
    while folder != project:
        try:
            values = read_dotenv(os.path.join(folder, ".env"))
        except (ConfigError, OSError):
            values = {}
        if any(values.get(name, "").strip() and name not in env for name in ("KB_AGENT_INDEX_DIR", "KB_AGENT_STORE")):
            return folder
        parent = os.path.dirname(folder)
        if parent == folder:
            break
        folder = parent
    return project


def closest_setting(typed: str, known: list[str], cutoff: float = 0.6) -> list[str]:
    """The known variable ``typed`` (upper case) most likely means, in a list of one, or none.

    Names are compared without the ``KB_AGENT_`` prefix they share, which would make every
    name look close to every other (``KB_AGENT_TEMP`` read as ``KB_AGENT_TOP_K``, ``KB_AGENT_DEBUG``
    as ``KB_AGENT_MODEL``); a name that is the start or the last words of one setting's
    (``KB_AGENT_TEMP``, ``KB_AGENT_TIMEOUT``) means that one. A name close to none gets none, and
    so does one that is the start or the last words of several (``KB_AGENT_BASE_URL``: Jira's,
    Confluence's, OpenAI's or the embeddings'), which naming one of them would guess."""
    import difflib

    bare = typed.removeprefix("KB_AGENT_")  # KB_AGENT_JIRA_BASE_URL: a setting named without the prefix
    stems = {name.removeprefix("KB_AGENT_"): name for name in known}
    if typed in known or bare in stems:
        return [typed] if typed in known else [stems[bare]]
    if sum(stem.startswith(bare + "_") or stem.endswith("_" + bare) for stem in stems) > 1:
        return []
    close = difflib.get_close_matches(bare, stems, n=1, cutoff=cutoff)
    if not close and len(bare) >= 3:
        parts = [stem for stem in stems if stem.startswith(bare) or stem.endswith("_" + bare)]
        close = sorted(parts, key=lambda stem: -difflib.SequenceMatcher(None, bare, stem).ratio())[:1]
    return [stems[stem] for stem in close]


def _missing_target(path: str | os.PathLike[str]) -> str | None:
    """Where a symbolic link to nothing points (a dotfiles checkout not there), shown; None for
    anything else (a link round in a loop is an error of reading ``.env``)."""
    from .safe_text import display_name

    if not os.path.islink(path):
        return None
    try:
        os.stat(path)
    except FileNotFoundError:
        try:
            return display_name(os.fsdecode(os.readlink(path)))
        except OSError:
            return "?"
    except (OSError, ValueError):
        pass
    return None
