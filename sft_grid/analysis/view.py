"""What the grid knows of its cells before deciding anything: each ledger, and the scheduler's view of every job
they name (one sacct and one squeue call for the whole grid, however many cells and preps).

A `GridView` is one reading, immutable: its histories are tuples behind read-only mappings and each cell's state
is derived once, when it is read. What adds to it (the triage `grid/triage.py settle` records) makes a new view
(`with_events`).

The commands that only read a grid read it `lenient`: a cell whose files are damaged (core/cellfiles.py `Damage`:
its cell.yaml cut short, a ledger line that is not UTF-8, a trainer state that is not JSON, the per-step log of a
completed training that ends before its last step...) gets its damage in `damage`, and a state from what can still
be read (its ledger's last state, where deriving it failed), and every other cell is read as ever. The grid's own
records beside its cells are checked by `grid_damage`, and `cell_dirs` lists a grid's cells, those whose cell.yaml is
gone or no file included."""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from sft_grid.core import events
from sft_grid.core.cellfiles import (
    READ_ERRORS,
    CellYaml,
    Damage,
    DamagedFile,
    damage_of,
    json_damage,
    jsonl_damage,
    trainer_log_damage,
)
from sft_grid.core.events import STATE_KINDS, Event, Kind
from sft_grid.core.layout import CELL_FILE, LAUNCH_FILE, LEDGER_FILE, OUTPUT_DIR, TRAINER_STATE
from sft_grid.core.state import UNAVAILABLE, CellState, SchedulerView, State, post_job_id, slurm_ref, state_of
from sft_grid.schedulers import slurm
from sft_grid.stages.evaluate import eval_job_id

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class GridView:
    """One reading of the grid: its ledgers, the scheduler's jobs, and each cell's state derived from them."""

    histories: Mapping[Path, tuple[Event, ...]]
    # None: nothing of these cells went to Slurm
    scheduler: SchedulerView | None
    # each cell's state (cells only: not the preps', stagings' or base models' directories)
    states: Mapping[Path, CellState]
    # a lenient reading's damaged files, per directory (cells and base models); no entry: nothing damaged
    damage: Mapping[Path, tuple[Damage, ...]] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def of(
        cls,
        histories: Mapping[Path, Sequence[Event]],
        scheduler: SchedulerView | None,
        cell_dirs: Iterable[Path],
        damage: Mapping[Path, Sequence[Damage]] | None = None,
    ) -> GridView:
        """`damage`: read leniently (read_view's `lenient`), with what is known to be damaged already; each cell's
        state is then derived where its files allow, and what stops it is added to its damage."""
        frozen = {d: tuple(h) for d, h in histories.items()}
        if damage is None:
            states = {d: state_of(d, scheduler, frozen[d]) for d in cell_dirs}
            return cls(histories=MappingProxyType(frozen), scheduler=scheduler, states=MappingProxyType(states))
        found = {d: tuple(v) for d, v in damage.items()}
        states = {}
        for d in cell_dirs:
            states[d], more = derive(d, scheduler, frozen[d])
            if more:
                found[d] = (*found.get(d, ()), *more)
        return cls(
            histories=MappingProxyType(frozen),
            scheduler=scheduler,
            states=MappingProxyType(states),
            damage=MappingProxyType({d: v for d, v in found.items() if v}),
        )

    def state(self, cell_dir: Path) -> CellState:
        known = self.states.get(cell_dir)
        return known if known is not None else state_of(cell_dir, self.scheduler, self.histories[cell_dir])

    def damaged(self, cell_dir: Path) -> tuple[Damage, ...]:
        """The damaged files of a cell (or a base model's directory), as this reading found them."""
        return self.damage.get(cell_dir, ())

    def whole_damage(self, cell_dir: Path) -> bool:
        """Whether the cell itself cannot be read as what it is (its state is shown as `damaged`)."""
        return any(d.whole for d in self.damage.get(cell_dir, ()))

    def with_damage(self, added: Mapping[Path, Sequence[Damage]]) -> GridView:
        """This view with these damaged files found after it was read (by a reader of the cell's other files)."""
        if not added:
            return self
        damage = {d: tuple(dict.fromkeys((*self.damage.get(d, ()), *added.get(d, ())))) for d in {*self.damage, *added}}
        return replace(self, damage=MappingProxyType(damage))

    def with_events(self, added: Mapping[Path, Sequence[Event]]) -> GridView:
        """This view with these events after each cell's history (what was just recorded), its states again."""
        if not added:
            return self
        histories = {d: (*h, *added.get(d, ())) for d, h in self.histories.items()}
        states = {d: state_of(d, self.scheduler, histories[d]) if d in added else st for d, st in self.states.items()}
        return GridView(
            histories=MappingProxyType(histories),
            scheduler=self.scheduler,
            states=MappingProxyType(states),
            damage=self.damage,
        )


def derive(cell_dir: Path, scheduler: SchedulerView | None, history: Sequence[Event]) -> tuple[CellState, list[Damage]]:
    """A cell's state and what of its files is damaged, read leniently: where deriving the state fails on a damaged
    file, the state its ledger last recorded (planned: none), and that file; a completed cell's per-step log that is
    damaged or ends before its last step (trainer_log_damage)."""
    state_file = cell_dir / OUTPUT_DIR / TRAINER_STATE
    try:
        if state_file.is_dir():  # no trainer state: the output would read as incomplete, the cell as failed
            raise DamagedFile(Damage(f"{OUTPUT_DIR}/{TRAINER_STATE}", "a directory, not a file"), state_file)
        st = state_of(cell_dir, scheduler, history)
    except READ_ERRORS as exc:
        damage = damage_of(cell_dir, exc)
        last = events.last(history, *STATE_KINDS)
        return CellState(State(last.kind.value) if last is not None else State.PLANNED, reason=damage.text()), [damage]
    if st.state is State.COMPLETED:
        log = trainer_log_damage(cell_dir / OUTPUT_DIR)
        if log is not None:
            return st, [log]
    return st, []


def read_view(
    cell_dirs: Sequence[Path],
    prep_dirs: Iterable[Path] = (),
    base_dirs: Sequence[Path] = (),
    ask: bool = True,
    lenient: bool = False,
) -> GridView:
    """Each ledger (cells, model preps, base models), and the scheduler's jobs of all of them: one query a site (a
    grid across sites asks each cell's site, by the client environment its submission recorded). `ask` False: no
    scheduler asked (copies of cells pulled from other sites: this machine's Slurm, if any, is not theirs); their
    states are their files' and ledgers'. `lenient`: what the commands that only read a grid ask for: damaged files
    are found and said (the view's `damage`), never raised, and every other cell is read as ever."""
    prep_dirs = list(prep_dirs)
    damage: dict[Path, list[Damage]] | None = None
    if lenient:
        histories: dict[Path, list[Event]] = {}
        damage = {}
        for d in [*cell_dirs, *prep_dirs, *base_dirs]:
            ledger = events.scan(d)
            histories[d] = ledger.events
            if ledger.damage is not None:
                damage.setdefault(d, []).append(ledger.damage)
        for d in cell_dirs:
            config = CellYaml.damage(d)
            if config is not None:
                damage.setdefault(d, []).insert(0, config)
    else:
        histories = {d: events.read(d) for d in [*cell_dirs, *prep_dirs, *base_dirs]}
    if not ask:
        return GridView.of(histories, None, list(cell_dirs), damage)
    groups: dict[tuple[tuple[str, str], ...], list[Path]] = {}
    for d in cell_dirs:
        groups.setdefault(tuple(sorted(events.submitted_site(histories[d])[1].items())), []).append(d)
    if len(groups) <= 1:
        return _read_site(histories, list(cell_dirs), prep_dirs, base_dirs, dict(next(iter(groups), ())), damage)
    views = [
        _read_site(histories, dirs, prep_dirs if not env else [], base_dirs if not env else [], dict(env), damage)
        for env, dirs in groups.items()
    ]
    states = {d: st for v in views for d, st in v.states.items()}
    found = {d: dmg for v in views for d, dmg in v.damage.items()}
    jobs = [j for v in views if v.scheduler is not None for j in (*v.scheduler.by_id.values(),)]
    tasks = {k: j for v in views if v.scheduler is not None for k, j in v.scheduler.by_task.items()}
    if all(v.scheduler is None for v in views):
        scheduler = None
    else:
        scheduler = SchedulerView(
            {j.job_id: j for j in jobs}, tasks, all(v.scheduler is None or v.scheduler.available for v in views)
        )
    frozen = {d: tuple(h) for d, h in histories.items()}
    return GridView(
        histories=MappingProxyType(frozen),
        scheduler=scheduler,
        states=MappingProxyType(states),
        damage=MappingProxyType(found),
    )


def _read_site(
    all_histories: Mapping[Path, Sequence[Event]],
    cell_dirs: Sequence[Path],
    prep_dirs: Sequence[Path],
    base_dirs: Sequence[Path],
    env: Mapping[str, str],
    all_damage: Mapping[Path, Sequence[Damage]] | None = None,
) -> GridView:
    histories = {d: all_histories[d] for d in [*cell_dirs, *prep_dirs, *base_dirs]}
    damage = None if all_damage is None else {d: all_damage[d] for d in histories if d in all_damage}
    refs = [r for r in (slurm_ref(histories[d]) for d in cell_dirs) if r is not None]
    ids = [r.job_id for r in refs if r.job_id]
    ids += [i for i in (post_job_id(histories[d]) for d in cell_dirs) if i]
    ids += [i for i in (eval_job_id(histories[d]) for d in [*cell_dirs, *base_dirs]) if i]
    ids += [job.job_id for d in prep_dirs if (job := events.last(histories[d], Kind.JOB)) is not None and job.job_id]
    names = [r.array for r in refs if not r.job_id and r.array]
    if not ids and not names:
        return GridView.of(histories, None, cell_dirs, damage)
    try:
        scheduler = SchedulerView.of(slurm.query(ids, names, env or None))
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("sacct failed (%s): Slurm cells keep their last recorded state", exc)
        scheduler = UNAVAILABLE
    return GridView.of(histories, scheduler, cell_dirs, damage)


# what a cell holds besides its cell.yaml: a directory with one of them is a cell whose cell.yaml is gone
_CELL_SIGNS = (LEDGER_FILE, LAUNCH_FILE, OUTPUT_DIR)


def cell_dirs(sweep_dir: Path) -> list[Path]:
    """A grid's cell directories, in name order: those with a cell.yaml (core/layout.iter_cell_dirs), and those whose
    cell.yaml is gone or no file but that hold what a cell holds (its ledger, launch.sh, output/): damaged cells,
    shown as such rather than left out. A `.`-name is a cell being written, a `_`-name the grid's own."""
    try:
        entries = sorted(sweep_dir.iterdir())
    except OSError:
        return []
    out = []
    for p in entries:
        if p.name.startswith((".", "_")):
            continue
        config = p / CELL_FILE
        if config.is_file() or (p.is_dir() and (config.exists() or any((p / s).exists() for s in _CELL_SIGNS))):
            out.append(p)
    return out


# The records a grid keeps beside its cells that a reading parses, and their kinds: the adaptive loop's latest
# round (analysis/report_data.py ADAPTIVE_FILE) and the steering records, one JSON object a line, appended whole
# (adaptive/halving.py and adaptive/steer.py RECORD_FILE). The site record (sites/remote.py RECORD) is said where
# it is read, before a command runs (cli/main.py).
GRID_RECORDS = (("adaptive.json", "json"), (".sft_grid_prune.jsonl", "jsonl"), (".sft_grid_adaptive.jsonl", "jsonl"))


def grid_damage(sweep_dir: Path) -> list[Damage]:
    """The damaged records of a grid (GRID_RECORDS), each named relative to the grid's directory."""
    found = []
    for name, kind in GRID_RECORDS:
        damage = json_damage(sweep_dir / name) if kind == "json" else jsonl_damage(sweep_dir / name)
        if damage is not None:
            found.append(damage)
    return found
