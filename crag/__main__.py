"""``python -m crag``: the command line. Ctrl-C while it loads ends the run with its line, as
``crag.cli`` does for its own imports."""

try:
    from .cli import main
except KeyboardInterrupt:
    import sys

    eval("None")  # as crag.cli._forget_interrupt does: python -m ends with 130, not killed by SIGINT
    print("crag: interrupted", file=sys.stderr)
    raise SystemExit(130) from None

raise SystemExit(main())
