"""python -m sft_grid: compose, validate, render and run a grid of SFT cells (a Hydra app).

    python -m sft_grid -m model=tiny_llama,tiny_qwen3 lr=2e-5     # a grid from the command line
    python -m sft_grid -m +sweep=smoke                             # a grid from sweeps/smoke.yaml
    python -m sft_grid -m +sweep=smoke dry_run=true                # render only, print the check table and plan
    python -m sft_grid model=tiny_llama lr=2e-5                    # one cell (a rerun)

Only light modules are imported here: `--help` must stay fast.
"""

from __future__ import annotations

import sys
from typing import TextIO

import hydra
from omegaconf import DictConfig

from sft_grid.planning.config import register

register()


@hydra.main(version_base=None, config_path="../conf", config_name="config")
def main(cfg: DictConfig) -> None:
    # Without -m Hydra hands over one composed cell; with -m the sft_grid launcher gets all cells.
    from sft_grid.app import run_single

    run_single(cfg)


class _KeyHints:
    """Passes stderr through and remembers Hydra's errors, to add the valid keys or options after them
    (Hydra composes the grid's base config itself and prints its own error before exiting)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.seen: list[str] = []

    def write(self, text: str) -> int:
        self.seen.append(text)
        return self.stream.write(text)

    def __getattr__(self, name: str) -> object:
        return getattr(self.stream, name)


def cli() -> None:
    hints = _KeyHints(sys.stderr)
    sys.stderr = hints  # type: ignore[assignment]
    try:
        main()
    except SystemExit as exc:
        sys.stderr = hints.stream
        if exc.code:
            from sft_grid.planning.messages import key_hint, malformed_override

            seen = "".join(hints.seen)
            hint = key_hint(seen) or malformed_override(sys.argv[1:])
            if hint and hint not in seen:
                print(f"hint: {hint}", file=sys.stderr)
        raise
    finally:
        sys.stderr = hints.stream


if __name__ == "__main__":
    cli()
