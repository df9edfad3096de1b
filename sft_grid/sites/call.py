"""What a site's own invocation is asked to do, carried in its arguments.

The machine a grid is launched from runs sft_grid on a remote site over ssh (sites/remote.py for a grid of one
site, sites/coordinate.py for a grid across sites, their read side for status, logs and cancel). What it asks of
that invocation travels as one argument, the first after the program (`--site-call=<JSON>`), which
`python -m sft_grid` and `sft-grid` take off before anything else reads their arguments (cli/main.py):

- `site`: the site it runs on: its cells are placed there, by its own Slurm, and a grid's record of sites is not
  followed again from there;
- `answer`: answer for the grid (grid/site_answer.py: the site's Slurm facts and its cells' states) and exit, with
  nothing rendered, staged or queued;
- `only`: run the grid for these cells alone (the site's share of a grid across sites);
- `let_go`, `cancel`: the cells the coordinator let go from this site (`sft-grid release`), and those of them let go
  with --cancel: their jobs there are gated before the site answers (sites/moves.py).

An argument, not an environment variable: a variable set for the site's invocation is inherited by everything it
starts (sbatch exports the submitting environment into every job by default), and one left set in a shell turns an
ordinary run into a site's own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass

FLAG = "--site-call"


@dataclass(frozen=True, kw_only=True)
class SiteCall:
    site: str
    answer: bool = False
    only: tuple[str, ...] | None = None  # None: every cell of the grid
    let_go: tuple[str, ...] = ()
    cancel: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        """The argument that carries this call (first after the program)."""
        return [f"{FLAG}={json.dumps(asdict(self), separators=(',', ':'))}"]


_current: SiteCall | None = None


def take(argv: Sequence[str]) -> list[str]:
    """The arguments without a leading --site-call=..., which is this process's call from then on (`current`). A
    malformed call is refused: it is only ever written by sft_grid itself (`SiteCall.argv`)."""
    global _current
    if not argv or not argv[0].startswith(f"{FLAG}="):
        return list(argv)
    data = json.loads(argv[0].partition("=")[2])
    if not isinstance(data, dict) or not isinstance(data.get("site"), str) or not data["site"]:
        raise SystemExit(f"sft-grid: {FLAG} names no site: {argv[0]!r}")
    only = data.get("only")
    _current = SiteCall(
        site=data["site"],
        answer=bool(data.get("answer")),
        only=None if only is None else tuple(map(str, only)),
        let_go=tuple(map(str, data.get("let_go") or ())),
        cancel=tuple(map(str, data.get("cancel") or ())),
    )
    return list(argv[1:])


def current() -> SiteCall | None:
    """This process's call, when it is a site's own invocation; None for every other run."""
    return _current


def here() -> str:
    """The site this process is the own invocation of; "" for every other run."""
    return _current.site if _current is not None else ""


@contextmanager
def calling(call: SiteCall | None) -> Iterator[None]:
    """Run as a site's own invocation asked `call` (in-process callers: tests, benchmarks), then as before."""
    global _current
    before, _current = _current, call
    try:
        yield
    finally:
        _current = before
