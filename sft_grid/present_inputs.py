"""Text a person reads about a grid's inputs: what is staged from the Hub and how much, a transfer's progress, and
the tokenized datasets its cells share. Formatting only: the command line prints what these return."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Any

from sft_grid.present import relative


def staging_lines(staging: Any, limit: int = 8) -> list[str]:
    """What a grid stages: each Hub repository with its files and sizes (a count when there are many), where the
    transfers run, and the free space of each filesystem against what must be fetched."""
    if staging is None or not staging.items:
        return []
    from sft_grid.stages.staging.values import human

    users = {cell for item in staging.items for cell, _ in item.users}
    pending = staging.pending
    if staging.unreachable:
        unresolved = [i for i in staging.items if i.pin is None]
        head = (f"staging: the Hub cannot be reached from here: {staging.unreachable.rstrip('.')}; "
                + (f"{len(unresolved)} of {len(staging.items)} Hub repositories for {len(users)} cell(s) are not"
                   " staged, sizes unknown" if unresolved else
                   f"all {len(staging.items)} Hub repositories for {len(users)} cell(s) are taken as staged"))
        return [head] + [f"  {i.text()}" for i in (unresolved or staging.items)[:limit]] + (
            [f"  ... and {len(unresolved) - limit} more"] if len(unresolved) > limit else [])
    needed = sum(i.bytes_needed for i in staging.items)
    lines = [(f"staging: {len(staging.items)} Hub repositories for {len(users)} cell(s), {human(needed)} for training,"
              f" {len(pending)} to stage ({human(staging.to_fetch)} to fetch)")]
    shown = pending if len(pending) <= limit else pending[:limit]
    lines += [f"  {i.text()}" for i in (shown or staging.items[:limit])]
    if len(pending) > limit:
        lines.append(f"  ... and {len(pending) - limit} more to stage")
    for s in staging.space:
        lines.append(f"  {human(s.to_fetch)} to fetch into {s.cache}: {human(s.free)} free there"
                     + (" (fits)" if s.fits else " (does NOT fit)"))
    where = {i.here for i in pending}
    if True in where:
        lines.append("  transfers run here, before anything is queued (cluster.staging.where=login)")
    if False in where:
        lines.append("  transfers run in a staging job that the cells wait for (cluster.staging.where=job)")
    return lines


def pinned_lines(staging: Any) -> list[str]:
    """A real run's word on its inputs: the Hub could not be asked (taken as staged), or how many are pinned."""
    if staging is None or not staging.items:
        return []
    if staging.unreachable:
        return staging_lines(staging)[:1]
    done = [i for i in staging.items if i.complete]
    return [(f"  {len(done)} of {len(staging.items)} Hub repositories staged and pinned (each cell's ledger records"
             " the commits it trains on)")]


def staged_lines(staging: Any, cells: int, dry_run: bool) -> list[str]:
    """What `python -m sft_grid.stage` (stage_only=true) did; nothing is rendered or queued either way."""
    if dry_run:
        return staging_lines(staging) + ["dry run: nothing staged"]
    items = staging.items if staging else []
    left = staging.pending if staging else []
    lines = [f"{len(items) - len(left)} of {len(items)} Hub repositories of {cells} cell(s) staged; nothing rendered"
             " or queued" + (f"; {len(left)} left for a staging job (cluster.staging.where=job), which the grid"
                             " command queues" if left else "")]
    return lines + [f"  {i.wanted.kind} {i.wanted.repo_id}@{i.pin.sha}: {i.pin.path}" for i in items
                    if i.pin is not None and i.complete]


class ProgressLine:
    """A transfer's progress as one line: rewritten in place on a terminal, else printed every `every_s` seconds
    and at the end of each file (a log stays readable)."""

    def __init__(self, stream: Any, every_s: float = 5.0) -> None:
        self.stream, self.every_s = stream, every_s
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.last = 0.0
        self.repo = ""
        self.open = False  # a line is drawn on the terminal and not ended yet

    def __call__(self, p: Any) -> None:
        import time

        from sft_grid.stages.staging.values import human

        now = time.monotonic()
        edge = p.repo_id != self.repo or p.files_done == p.files_total  # a repository starts or is complete
        if not self.tty and not edge and now - self.last < self.every_s:
            return
        self.last, self.repo = now, p.repo_id
        pct = f" ({100 * p.done / p.total:.0f}%)" if p.total else ""
        rate = f" at {human(p.rate_bps)}/s" if p.rate_bps else ""
        eta = f", {int(p.eta_s) // 60}:{int(p.eta_s) % 60:02d} left" if p.eta_s is not None else ""
        text = (f"  staging {p.repo_id}: {human(p.done)} / {human(p.total)}{pct}{rate}{eta}, file"
                f" {p.files_done}/{p.files_total} {p.file}")
        if self.tty:
            self.stream.write("\r" + text[:160].ljust(160))
            self.open = p.files_done != p.files_total
            if not self.open:
                self.stream.write("\n")
        else:
            self.stream.write(text + "\n")
        self.stream.flush()


    def end(self) -> None:
        """End a line left open on the terminal, so that what is printed next starts on its own line."""
        if self.open:
            self.stream.write("\n")
            self.stream.flush()
            self.open = False


def tokenize_lines(tokenized: Mapping[Any, Any], limit: int = 6) -> list[str]:
    """Tokenize once: how many tokenized datasets the running cells share, and what tells them apart."""
    if not tokenized:
        return []
    groups = Counter(t.dir for t in tokenized.values())
    toks = {t.dir: t for t in tokenized.values()}
    lines = [(f"  tokenize once: {len(groups)} tokenized dataset(s) for {len(tokenized)} cell(s), each built once"
              " before its cells:")]
    for directory, n in list(groups.items())[:limit]:
        tok = toks[directory]
        ident = tok.identity
        tokenizer = ident["tokenizer"].get("digest") or f"{ident['tokenizer'].get('name')} (by name: not readable here)"
        sources = "+".join(f"{s[0]}@{str(s[2])[:12]}" if s[1] == "hub" else s[0] for s in ident["sources"])
        state = "built" if tok.data.complete else "to build"
        seed = ident["data"].get("config", {}).get("seed")
        lines.append(f"    {tok.backend} {tok.data.key}: {n} cell(s), tokenizer {tokenizer}, template"
                     f" {ident['template']}, {sources}, mix {ident['mix'][0]}"
                     + (f", seed {seed}" if seed is not None else "") + f", cutoff"
                     f" {ident['cutoff_len']} ({state}: {relative(tok.dir)})")
    if len(groups) > limit:
        lines.append(f"    ... and {len(groups) - limit} more")
    return lines
