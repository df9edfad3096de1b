"""LLaMA-Factory with sft_grid's own chat templates, registered in LLaMA-Factory's own process.

LLaMA-Factory 0.9.5 ships no `delphi` template, and its ReasoningTemplate would not match the Delphi jinja
anyway: it prepends an empty think block to every answer without reasoning and trains on it, and it does
not see an inline <think>. So the template is registered here, in every training process, with the jinja
itself as the single source of truth: each turn's text is the difference between jinja renders of growing
prefixes of the conversation (a prompt ends with the generation prompt, a response is everything the
assistant turn adds after it). LLaMA-Factory then trains exactly the text the jinja renders at serving
time, masks the prompts as usual, and saves the jinja as the tokenizer's chat_template. Inline reasoning
needs no rewriting of the data: the jinja parses an inline <think>...</think> itself and writes the think
block only when the reasoning is non-empty; content with the Delphi think tokens already inline is trained
as it is, exactly as the jinja renders it.

Runs inside the backend environment (standalone: it never imports sft_grid).

    python sft_grid_lf.py [--template NAME=FILE.jinja] train CONFIG.yaml [key=value ...]
        register, then LLaMA-Factory's `llamafactory-cli train` (which starts torchrun itself when
        FORCE_TORCHRUN is set: the ranks it starts run this file again and register too)
    python sft_grid_lf.py [--template NAME=FILE.jinja] CONFIG.yaml [key=value ...]
        register, then train in this process (a rank started by torchrun or accelerate)
    python sft_grid_lf.py [--template NAME=FILE.jinja] tokenize CONFIG.yaml
        register, then only LLaMA-Factory's preprocessing into the config's tokenized_path (the grid's
        tokenize-once stage)

Every training process also gets sft_grid's loss watchdog (loss_watchdog.py) added to run_exp's callbacks, and
records its data step (data_step.py: LLaMA-Factory's get_dataset, timed). A leg of a pruned grid (the job
runner sets SFT_GRID_LEG_STOP) also gets leg_stop.py's callback, which ends training at the rung's step with its
checkpoint saved, the learning-rate schedule left as the full run's.

What LLaMA-Factory trains on with these templates is shown by sft_grid's loss-mask probe (in_venv/mask_probe.py),
which registers them through register_all() as training does.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

# The templates of this process, passed on to the ranks torchrun starts (they run this file again).
TEMPLATES_ENV = "SFT_GRID_LF_TEMPLATES"
STOP_WORD = "<|eot_id|>"


def _lf_to_openai(messages: list[dict[str, str]], system: str | None) -> list[dict[str, Any]]:
    """LLaMA-Factory's converted messages (user/assistant/observation/function) as the chat messages a
    jinja template takes (system/user/assistant with tool_calls/tool)."""
    out: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    for message in messages:
        role, content = message["role"], message["content"]
        if role == "function":
            text, calls = _split_calls(content)
            out.append(
                {
                    "role": "assistant",
                    "content": text,
                    "tool_calls": [
                        {"type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                        for c in calls
                    ],
                }
            )
        elif role == "observation":
            out.append({"role": "tool", "content": content})
        else:
            out.append({"role": role, "content": content})
    return out


_CALL = re.compile(r"<\|tool_call\|>(.*?)<\|tool_call_end\|>", re.DOTALL)


def _split_calls(content: str) -> tuple[str, list[dict[str, Any]]]:
    """A function message: a JSON call or list of calls, or text with calls wrapped in the tool tokens."""
    try:
        calls = json.loads(content)
        text = ""
    except json.JSONDecodeError as err:
        found = _CALL.findall(content)
        if not found:
            raise ValueError(f"function message is neither JSON nor <|tool_call|>-wrapped: {content[:200]!r}") from err
        calls = [json.loads(c) for c in found]
        text = _CALL.sub("", content).rstrip("\n")
    return text, calls if isinstance(calls, list) else [calls]


def _segments(
    tokenizer: Any, template: str, conversation: list[dict[str, Any]], first: int, tools: list[Any] | None
) -> list[str]:
    """The text each message adds to the render: prompts end with the generation prompt."""

    def render(upto: int, prompt: bool) -> str:
        text: str = tokenizer.apply_chat_template(
            conversation[:upto], chat_template=template, tools=tools, tokenize=False, add_generation_prompt=prompt
        )
        return text

    texts, done = [], ""
    for i in range(first, len(conversation)):
        prompt = (i - first) % 2 == 0
        text = render(i + 1, prompt)
        if not text.startswith(done):
            raise ValueError(
                "the chat template does not render a conversation as a prefix of its continuation;"
                f" cannot split it into trained turns:\n{done!r}\n{text!r}"
            )
        texts.append(text[len(done) :])
        done = text
    return texts


def register(name: str, jinja_file: str) -> None:
    """Register `name` as a LLaMA-Factory template driven by the jinja file (once per process)."""
    from llamafactory.data.formatter import EmptyFormatter, StringFormatter
    from llamafactory.data.template import TEMPLATES, Template, register_template

    jinja = Path(jinja_file).read_text()
    if name in TEMPLATES:
        if getattr(TEMPLATES[name], "sft_grid_jinja", None) != jinja:
            raise ValueError(f"LLaMA-Factory already has a template named {name!r}: sft_grid will not replace it")
        return

    class JinjaTemplate(Template):
        sft_grid_jinja = jinja

        def _encode(
            self, tokenizer: Any, messages: list[dict[str, str]], system: str | None, tools: str | None
        ) -> list[list[int]]:
            conversation = _lf_to_openai(messages, system or self.default_system)
            first = len(conversation) - len(messages)
            tool_list = json.loads(tools) if tools else None
            return [
                tokenizer.encode(text, add_special_tokens=False)
                for text in _segments(tokenizer, jinja, conversation, first, tool_list)
            ]

        def _get_jinja_template(self, tokenizer: Any) -> str:
            return jinja  # saved with the model: what serving renders is what was trained

    # The Llama-3 slots describe the format to LLaMA-Factory's other users (chat, export); training goes
    # through _encode above. Plain Template, not ReasoningTemplate: no empty think block is ever added.
    register_template(
        name=name,
        format_user=StringFormatter(
            slots=[
                "<|start_header_id|>user<|end_header_id|>\n\n{{content}}<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n"
            ]
        ),
        format_assistant=StringFormatter(slots=["{{content}}<|eot_id|>"]),
        format_system=StringFormatter(slots=["<|start_header_id|>system<|end_header_id|>\n\n{{content}}<|eot_id|>"]),
        format_prefix=EmptyFormatter(slots=[{"bos_token"}]),
        stop_words=[STOP_WORD],
        thought_words=("<|start_think|>\n", "\n<|end_think|>\n\n"),
        replace_eos=True,
        replace_jinja_template=True,
        template_class=JinjaTemplate,
    )


def register_all(specs: dict[str, str]) -> None:
    for name, path in specs.items():
        register(name, path)


def _parse(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    specs = json.loads(os.environ.get(TEMPLATES_ENV) or "{}")
    while argv and argv[0] == "--template":
        name, _, path = argv[1].partition("=")
        specs[name] = str(Path(path).resolve())
        argv = argv[2:]
    return specs, argv


def _with_callbacks(extra: list[Any]) -> None:
    """LLaMA-Factory's run_exp, wherever it is called from (its launcher, or a rank), gets these callbacks too."""
    from llamafactory.train import tuner

    run_exp = tuner.run_exp

    def with_extra(args: Any = None, callbacks: Any = None) -> None:
        run_exp(args, [*(callbacks or []), *extra])

    tuner.run_exp = with_extra


def add_watchdog() -> None:
    """The loss watchdog's callbacks (loss_watchdog.py, beside this file), unless launch.sh turned it off."""
    if os.environ.get("SFT_GRID_WATCHDOG", "on") == "off":
        return
    import loss_watchdog

    _with_callbacks(loss_watchdog.llamafactory_callbacks())


def add_leg_stop() -> None:
    """The callback that ends this leg at its rung (leg_stop.py, beside this file), when the job runner asked for
    one (SFT_GRID_LEG_STOP)."""
    import leg_stop

    extra = leg_stop.callbacks()
    if extra:
        _with_callbacks(extra)


def tokenize(argv: list[str]) -> int:
    """LLaMA-Factory's own preprocessing of an sft run, started as run_sft starts it, then stop: with
    `tokenized_path` set it saves the tokenized dataset there (0.9.5 does not stop by itself; it would go on to
    load the model). No model is loaded."""
    from llamafactory.data import get_dataset, get_template_and_fix_tokenizer
    from llamafactory.hparams import get_train_args
    from llamafactory.model import load_tokenizer

    sys.argv = [sys.argv[0], *argv]
    model_args, data_args, training_args, _, _ = get_train_args()
    if not data_args.tokenized_path:
        raise SystemExit("tokenize: the config sets no tokenized_path")
    module = load_tokenizer(model_args)
    template = get_template_and_fix_tokenizer(module["tokenizer"], data_args)
    get_dataset(template, model_args, data_args, training_args, stage="sft", **module)
    return 0


def main(argv: list[str]) -> int:
    specs, argv = _parse(argv)
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    os.environ[TEMPLATES_ENV] = json.dumps(specs)
    register_all(specs)
    add_watchdog()
    add_leg_stop()
    import cpu_resume  # beside this file: a multi-process CPU run resumes its optimizer state
    import data_step  # beside this file: the data step's record (SFT_GRID_DATA_STEP)

    cpu_resume.patch()
    data_step.patch_llamafactory()
    if argv[0] == "tokenize":
        return tokenize(argv[1:])
    if argv[0] == "train":
        from llamafactory import launcher

        # LLaMA-Factory's own launcher, unchanged, except that the ranks it starts with torchrun run this
        # file (which registers the templates, then trains) instead of its launcher module
        launcher.__file__ = str(Path(__file__).resolve())
        sys.argv = [sys.argv[0], *argv]
        launcher.launch()
        return 0
    from llamafactory.train import tuner

    sys.argv = [sys.argv[0], *argv]
    tuner.run_exp()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
