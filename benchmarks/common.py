"""Helpers shared by crag's benchmarks: where results go, how they are written, the run's
environment, percentiles, Markdown tables, and matplotlib when it is installed.

Every benchmark writes three files of one name under its output directory (by default
``benchmarks/results/``): ``NAME.json`` (every figure, the arguments and the machine, for
comparing runs), ``NAME.md`` (the tables that ``docs/benchmarks.md`` quotes) and
``NAME.png`` (a chart; skipped with a note when matplotlib is not installed). matplotlib and
langgraph are benchmark-only extras (``pip install -e '.[bench]'``); crag never imports them.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import importlib.metadata
import json
import math
import os
import platform
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "RESULTS_DIR",
    "SHARED",
    "append_jsonl",
    "at_least",
    "check_server_url",
    "command_line",
    "counts",
    "crag_settings",
    "environment",
    "fmt",
    "fractions",
    "load_pyplot",
    "markdown_table",
    "non_negative",
    "out_dir",
    "percentile",
    "positive",
    "quick_out",
    "read_jsonl",
    "read_judged_pairs",
    "record_file",
    "results_name",
    "run_main",
    "same_setup",
    "write_json",
    "write_text",
]

RESULTS_DIR = Path(__file__).resolve().parent / "results"
# The shared data the benchmarks read (the corpora, the prose set, the TREC DL judged pairs):
# beside the clone, or wherever CRAG_SHARED says.
SHARED = Path(os.environ.get("CRAG_SHARED") or Path(__file__).resolve().parents[2] / "shared")


def environment(packages: Iterable[str] = ()) -> dict[str, Any]:
    """The machine and versions a run was measured on, for the JSON record."""
    versions = {}
    for name in packages:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "packages": versions,
    }


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) with linear interpolation between ranks (numpy's default)."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def fmt(value: Any, digits: int = 2) -> str:
    """A number for a Markdown table: thousands separators for ints, fixed decimals for floats."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if math.isnan(value):
            return "–"
        return f"{value:,.{digits}f}"
    return str(value)


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]], align: str | None = None) -> str:
    """A GitHub Markdown table; ``align`` is one letter per column, ``l`` or ``r`` (numbers right)."""
    rows = [list(r) for r in rows]
    align = align or "l" + "r" * (len(headers) - 1)
    marks = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(marks) + " |"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_json(path: Path, data: Any) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=_json_default) + "\n")
    os.replace(tmp, path)
    return path


def write_text(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
    return path


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def load_pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend, or None when matplotlib is absent."""
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def no_chart_note(name: str) -> str:
    return f"{name}: matplotlib is not installed, chart skipped (pip install -e '.[bench]')"


def python_cmd() -> list[str]:
    """The interpreter running the benchmark, for subprocess measurements."""
    return [sys.executable]


def write_report(name: str, result: Any, out: Path, render_markdown, render_chart, verbose: bool) -> Any:
    """Write ``NAME.json``, ``NAME.md`` and (with matplotlib) ``NAME.png`` under ``out``."""
    write_json(out / f"{name}.json", result)
    write_text(out / f"{name}.md", render_markdown(result))
    if render_chart(result, out / f"{name}.png") is None:
        print(no_chart_note(name))
    if verbose:
        print(render_markdown(result))
    return result


# -- the command line ------------------------------------------------------------------------


def out_dir(value: str) -> Path:
    """argparse type of ``--out``: a folder that exists or can be made, checked before a run
    spends its time, so its results are never lost at the end for want of a place to go."""
    path = Path(value)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot make the folder {value} ({exc.strerror})") from exc
    if not os.access(path, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"cannot write in the folder {value}")
    return path


def quick_out(out: Path | None, quick: bool, default: Path = RESULTS_DIR) -> Path:
    """Where a run writes: ``--out`` when given; else, for a ``--quick`` run, a new temporary
    folder (its figures are a smoke test's, and would overwrite the committed ones), said on
    standard error; else ``default``."""
    if out is not None:
        return out
    if not quick:
        return default
    import tempfile

    folder = Path(tempfile.mkdtemp(prefix="crag-bench-quick-"))
    print(f"a --quick run writes to {folder} (--out DIR to choose; the committed results are left alone)",
          file=sys.stderr)
    return folder


def record_file(value: str) -> Path:
    """argparse type of ``--record``: a file (new or not) in a folder that exists or can be made."""
    path = Path(value)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{value} is a folder, not a file")
    out_dir(str(path.parent))
    return path


def results_name(value: str) -> str:
    """argparse type of ``--name``: part of a file name in ``--out`` (no folder, nothing hidden),
    checked before a run, so its results are not written elsewhere or lost at its end."""
    if not value or value != value.strip() or any(c in value for c in "/\\\0") or value.startswith("."):
        raise argparse.ArgumentTypeError(f"a results name is one word of a file name, not {value!r}")
    return value


def at_least(lo: int) -> Callable[[str], int]:
    """argparse type of a count: a whole number >= ``lo``."""

    def count(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {value!r}") from None
        if n < lo:
            raise argparse.ArgumentTypeError(f"must be at least {lo}, got {n}")
        return n

    count.__name__ = f"count >= {lo}"
    return count


def llm_timeout(value: str) -> float:
    """argparse type of ``--timeout``: what crag's ``KB_AGENT_LLM_TIMEOUT`` accepts, checked when
    the arguments are read. The benchmark hands it to crag in that variable, which refused a bad
    one only after the indexing, blaming a setting "in the environment" the user never set."""
    from crag.config import seconds
    from crag.errors import ConfigError

    rule = seconds(0.001)
    try:
        return rule("--timeout", value)
    except ConfigError:
        raise argparse.ArgumentTypeError(f"must be {rule.accepts}, got {value}") from None


def check_server_url(parser: argparse.ArgumentParser, value: str) -> None:
    """Refuse a ``--base-url`` crag's ``OPENAI_BASE_URL`` would not accept, when the arguments are
    read (``parser.error``: one line, exit status 2). The benchmark hands it to crag in that
    variable, which refused a bad one only after the indexing (benchmarks.field after every
    question), blaming a setting "in the environment" the user never set. Checked only for a
    run that uses a server, as its default comes from ``OPENAI_BASE_URL``."""
    from crag.config import Settings
    from crag.errors import ConfigError
    from crag.safe_text import short_value

    try:
        if not value.strip():
            raise ConfigError("OPENAI_BASE_URL", value, "an http:// or https:// URL")
        Settings(openai_base_url=value)
    except ConfigError as exc:
        parser.error(f"argument --base-url: must be {exc.accepts}, got {short_value(exc.value) or repr('')}")


def crag_settings(parser: argparse.ArgumentParser, items: Sequence[str]) -> dict[str, str]:
    """The ``--set KB_AGENT_X=VALUE`` items as a mapping, each a crag setting, or
    ``parser.error``: a name crag does not know (``KB_AGENT_GRADE_MEMROY=on``) would be ignored
    by crag, and the whole run measured its default under the setting's name."""
    from crag.config import OTHER_VARIABLES, SETTINGS_TABLE
    from crag.setting_warnings import closest_setting

    pairs = [item.partition("=") for item in items]
    bad = [k for k, eq, _ in pairs if not eq or not k.startswith("KB_AGENT_")]
    if bad:
        parser.error(f"--set takes KB_AGENT_NAME=VALUE, not {bad[0]!r}")
    known = [var for var, _ in SETTINGS_TABLE.values()] + list(OTHER_VARIABLES)
    unknown = [k for k, _, _ in pairs if k not in known]
    if unknown:
        close = closest_setting(unknown[0].upper(), known)
        parser.error(f"--set: {unknown[0]} is not a crag setting" + (f"; did you mean {close[0]}?" if close else ""))
    return {k: v for k, _, v in pairs}


def positive(value: str) -> float:
    """argparse type of a duration, size or ratio: a finite number above 0."""
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not math.isfinite(x) or x <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {value}")
    return x


def non_negative(value: str) -> float:
    """argparse type of a noise level or a fixed cost: a finite number, 0 or more."""
    try:
        x = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if not math.isfinite(x) or x < 0:
        raise argparse.ArgumentTypeError(f"must be a number of at least 0, got {value}")
    return x


def fractions(value: str) -> list[float]:
    """argparse type of a comma-separated list of thresholds, each a number in [0, 1]
    ('' for none)."""
    out = []
    for part in (p.strip() for p in value.split(",")):
        if not part:
            continue
        try:
            x = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {part!r}") from None
        if not 0.0 <= x <= 1.0:  # nan is not either
            raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {part}")
        out.append(x)
    return out


def counts(lo: int) -> Callable[[str], list[int]]:
    """argparse type of a comma-separated list of counts, each a whole number >= ``lo``."""
    one = at_least(lo)

    def parse(value: str) -> list[int]:
        return [one(part.strip()) for part in value.split(",") if part.strip()]

    parse.__name__ = f"counts >= {lo}"
    return parse


def command_line(prog: str, argv: Sequence[str]) -> str:
    """The command a report quotes: ``prog`` and ``argv`` with the value of ``--api-key`` (or an
    abbreviation argparse takes for it) masked, and a password in a URL or another credential
    shape too (crag's ``redact_message``). Reports are committed beside the code: a key typed
    on the command line must not go with them."""
    from crag.safe_text import REDACTED, redact_message

    words, hide = [], False
    for arg in argv:
        name, eq, _ = arg.partition("=")
        if hide:
            arg, hide = REDACTED, False
        elif len(name) > 4 and "--api-key".startswith(name):
            arg, hide = (name + eq + REDACTED, False) if eq else (arg, True)
        words.append(arg)
    return redact_message(" ".join([prog, *words]))


def run_main(main: Callable[[], Any], prog: str) -> int:
    """Run a benchmark's ``main`` as a command: a failure it can name (a file it cannot read or
    write, data that is not what it expects, a crag error such as an unreachable server) is
    one line on stderr and exit status 1, never a traceback; an interrupt is exit status 130."""
    from crag.errors import CragError

    try:
        result = main()
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except (CragError, OSError, ValueError) as exc:
        message = " ".join(str(exc).split()) or type(exc).__name__
        print(f"{prog}: error: {message}", file=sys.stderr)
        return 1
    return result if isinstance(result, int) and not isinstance(result, bool) else 0


# -- the TREC DL judged pairs ------------------------------------------------------------------

JUDGED_PAIR = {"collection": str, "qid": str, "query": str, "docid": str, "bm25_rank": int, "passage": str,
               "grade": int}


def read_judged_pairs(path: Path) -> list[dict]:
    """The judged pairs of ``path`` (JSONL, one object a line with the fields of ``JUDGED_PAIR``);
    a line that is not one is a ``ValueError`` naming it, a file with none another."""
    rows = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError as exc:
            raise ValueError(f"{path}:{n} is not a judged pair as JSON ({exc})") from exc
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{n} is not a judged pair as JSON (not an object)")
        for key, kind in JUDGED_PAIR.items():
            value = row.get(key)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ValueError(f"{path}:{n} is not a judged pair as JSON ({key!r} is not a {kind.__name__})")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path} holds no judged pairs")
    return rows


# -- append-only records of a resumable run --------------------------------------------------


def read_jsonl(path: Path) -> list[dict]:
    """The JSON objects of a record, one a line; a line cut short by a killed run (or anything
    else that is not an object) is skipped, and its work is done again."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def same_setup(row: dict, setup: dict) -> bool:
    """Whether a record's ``row`` was written by a run of this ``setup`` (the server, the model
    and whatever else changes a reply), so a resumed run may count it instead of asking again.
    A row without a setup was written before rows carried one, and counts for any run, as it
    did then: records made before stay resumable."""
    return row.get("setup", setup) == setup


def append_jsonl(path: Path, row: dict) -> None:
    """Append ``row`` as one line. A last line cut short by a killed run is ended first, so the
    new row gets a line of its own instead of being glued to the fragment and lost with it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a+b") as f:
        if f.seek(0, os.SEEK_END) > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                f.write(b"\n")
        f.write(json.dumps(row, ensure_ascii=False).encode("utf-8") + b"\n")
