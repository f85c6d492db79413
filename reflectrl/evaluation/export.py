"""`reflectrl export`: a run's two players as plain Hugging Face model directories.

The policy is loaded exactly as `reflectrl eval --run` loads it (runner.run_policy), its LoRA
merged into the base weights; the reflection is the model the run's server serves. Both are
written with `save_pretrained` plus their tokenizer and a model card, so `transformers` alone
loads them. Everything is built in a hidden folder beside --out and renamed into place once
complete; an --out that holds anything is never touched.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reflectrl.config import ReflectRLConfig
from reflectrl.errors import ConfigError

if TYPE_CHECKING:  # runner imports Ray; `--help` must stay fast
    from reflectrl.evaluation.held_out import PolicySource

VALUE_HEAD_FILE = "value_head.safetensors"


@dataclass(frozen=True)
class Exported:
    """One written player: what the card says about it."""

    name: str  # "policy" or "reflection"
    base: str  # the base model's directory
    weights: str  # where the merged weights came from
    value_head: bool


def add_commands(sub: Any) -> None:
    ex = sub.add_parser(
        "export",
        help="write a run's policy and reflection as plain Hugging Face model directories",
        description="Write DIR/policy (the run's final policy: the latest RL checkpoint, else "
        "the SFT policy) and DIR/reflection (the SFT reflection the run serves), each with its "
        "LoRA merged into the base weights, its tokenizer and a model card (held-out figures, "
        "action head, the run's config). transformers.AutoModelForCausalLM loads them without "
        "peft or reflectrl. The policy's value head, if any, is saved beside as "
        f"{VALUE_HEAD_FILE}.",
    )
    ex.add_argument("run", metavar="RUN", help="a run directory (after its sft stage)")
    ex.add_argument("--out", metavar="DIR", required=True, help="a new or empty folder")
    ex.set_defaults(handler=run_export)


def run_export(args: argparse.Namespace) -> int:
    from reflectrl.atomic_files import atomic_dir
    from reflectrl.config import load_config
    from reflectrl.run_dir import CONFIG_FILE, SFT_DIR, sft_players, stage_done

    run_dir, out = Path(args.run), Path(args.out)
    if out.exists() and not (out.is_dir() and not any(out.iterdir())):
        raise ConfigError(f"--out {out}: exists and is not an empty folder; choose a new one")
    if not (run_dir / CONFIG_FILE).is_file():
        raise ConfigError(f"RUN {run_dir}: no {CONFIG_FILE} there; is it a run directory?")
    config = load_config(run_dir / CONFIG_FILE)
    missing = [p for p in sft_players(config) if not (run_dir / SFT_DIR / p).is_dir()]
    if not config.sft.enabled or stage_done(run_dir, "sft") is None or missing:
        raise ConfigError(
            f"RUN {run_dir}: no SFT players (sft stage off or unfinished); finish it with "
            f"`reflectrl launch --resume {run_dir}`"
        )
    try:
        with atomic_dir(out, replace=False) as tmp:
            written = [export_policy(run_dir, config, tmp / "policy")]
            reflection = export_reflection(run_dir, config, tmp / "reflection")
            written += [reflection] if reflection is not None else []
    except FileExistsError:  # something was written to --out while the export ran
        raise ConfigError(
            f"--out {out}: exists and is not an empty folder; choose a new one"
        ) from None
    for player in written:
        print(f"wrote {out / player.name}")
    return 0


def final_source(
    run_dir: Path, config: ReflectRLConfig
) -> tuple[ReflectRLConfig, PolicySource, str]:
    """(the config the players run with, the PolicySource, where it is): what `reflectrl eval
    --run` evaluates, or for a run stopped during RL its latest checkpoint, or before RL its
    SFT policy."""
    from reflectrl.evaluation.held_out import PolicySource, run_policy
    from reflectrl.run_dir import latest_checkpoint, rl_config, stage_done

    if config.rl.enabled and stage_done(run_dir, "rl") is None:
        checkpoint = latest_checkpoint(run_dir)
        if checkpoint is not None:
            source = PolicySource(checkpoint_adapter=checkpoint / "adapter")
            return rl_config(config, run_dir), source, f"{checkpoint} (RL unfinished)"
        config = config.model_copy(update={"rl": config.rl.model_copy(update={"enabled": False})})
    derived, source = run_policy(run_dir, config)
    where = source.checkpoint_adapter or source.sft_adapter or f"{derived.policy.model} (as is)"
    return derived, source, str(where)


def export_policy(run_dir: Path, config: ReflectRLConfig, out: Path) -> Exported:
    import torch
    from safetensors.torch import save_file

    from reflectrl.models.loading import load_tokenizer
    from reflectrl.models.policy import build_policy
    from reflectrl.preflight import preflight

    derived, source, where = final_source(run_dir, config)
    spec = preflight(derived)  # the label tokens, and a one-line error for a broken run
    print(f"export: policy: {spec.model_dir} + {where}", flush=True)
    critic = source.checkpoint_adapter is not None and config.rl.critic
    policy = build_policy(
        derived.policy, spec.model_dir, spec.label_token_ids, derived.run.seed,
        for_rollouts=False, critic=critic,
    )  # fmt: skip
    source.load_into(policy)
    with torch.no_grad():
        policy.lm.merge_and_unload().save_pretrained(str(out), safe_serialization=True)
    load_tokenizer(spec.model_dir).save_pretrained(str(out))
    if policy.value_head is not None:
        head = {k: v.detach().contiguous() for k, v in policy.value_head.state_dict().items()}
        save_file(head, str(out / VALUE_HEAD_FILE), metadata={"format": "pt"})
    exported = Exported("policy", str(spec.model_dir), where, policy.value_head is not None)
    write_card(out, run_dir, derived, exported, spec.label_token_ids)
    return exported


def export_reflection(run_dir: Path, config: ReflectRLConfig, out: Path) -> Exported | None:
    import torch
    from peft import PeftModel

    from reflectrl.data.scratch import resolve_or_build
    from reflectrl.models.loading import load_causal_lm, load_tokenizer
    from reflectrl.run_dir import rl_config

    r = rl_config(config, run_dir).reflection
    if not (r.enabled and r.server == "local"):
        print("export: reflection: the run serves none of its own (reflection.server=url or "
              "reflection.enabled=false); not exported", flush=True)  # fmt: skip
        return None
    model_dir = resolve_or_build(r.model)
    print(f"export: reflection: {model_dir}" + (f" + {r.adapter}" if r.adapter else ""))
    model = load_causal_lm(model_dir)
    if r.adapter:
        model = PeftModel.from_pretrained(model, r.adapter).merge_and_unload()
    with torch.no_grad():
        model.save_pretrained(str(out), safe_serialization=True)
    load_tokenizer(model_dir).save_pretrained(str(out))
    weights = f"`{r.adapter}` merged into `{model_dir}`" if r.adapter else f"`{model_dir}`"
    exported = Exported("reflection", str(model_dir), weights, False)
    write_card(out, run_dir, config, exported, [])
    return exported


def write_card(
    out: Path, run_dir: Path, config: ReflectRLConfig, player: Exported, label_ids: list[int]
) -> None:
    from reflectrl.atomic_files import write_text
    from reflectrl.run_dir import CONFIG_FILE
    from reflectrl.text.prompts import ACTION_MARKER, ANALYZE_MARKER, MENU_HEADER

    p = config.policy
    reflected = config.reflection.enabled  # else the no-reflection ablation's prompt
    menu = f", the menu (`{MENU_HEADER!r}` then one `<label>. <action>` line each)"
    lines = [f"# {run_dir.resolve().name}: {player.name}", ""]
    if player.name == "policy":
        lines += [
            f"The final policy of the Reflect-RL run `{run_dir}`, its LoRA merged into the base "
            f"weights (float32). Weights: `{player.weights}`. Base model: `{player.base}`.",
            "",
            "## Scoring actions",
            "",
            "The prompt is the task instruction, the observation"
            + (f", `{ANALYZE_MARKER!r}`, the reflection's analysis" if reflected else "")
            + (menu if p.show_menu else "")
            + f", and ends with `{ACTION_MARKER!r}`; no special tokens are added.",
            "",
        ]
        if p.action_head == "label":
            shown = zip(p.labels[: len(label_ids)], label_ids, strict=True)
            labels = ", ".join(f"`{label}` ({i})" for label, i in shown)
            lines += [
                "Action head `label`: the policy's choice is the next token after the prompt. "
                "Take the next-token logits at the prompt's last token, keep the label tokens of "
                "the actions on the menu, softmax over them. Labels in menu order (token ids): "
                f"{labels}.",
            ]
        else:
            lines += [
                "Action head `text`: each valid action is scored by the summed log-probability "
                f"of its tokens (`' ' + action` then EOS, at most {p.action_max_tokens} tokens) "
                f"after the prompt, divided by `{p.text_normalisation}` (token: the token count; "
                "word: the word count; none: 1); softmax over the valid actions.",
            ]
        if player.value_head:
            lines += [
                "",
                f"`{VALUE_HEAD_FILE}` (not part of the causal LM): the value head, a linear map "
                "(`weight` [1, hidden], `bias` [1]) of the final hidden state at the prompt's last "
                "token (after the final norm) to V(s).",
            ]
    else:
        lines += [
            f"The frozen reflection model of the Reflect-RL run `{run_dir}`: it writes the "
            "analysis after the prompt (task instruction, observation, "
            f"`{ANALYZE_MARKER!r}`). Weights: {player.weights} (float32).",
        ]
    lines += ["", "## Held-out results", "", *eval_table(run_dir), "", "## Run config", ""]
    lines += ["```yaml", (run_dir / CONFIG_FILE).read_text().rstrip(), "```", ""]
    write_text(out / "README.md", "\n".join(lines))


def eval_table(run_dir: Path) -> list[str]:
    """The run's held-out evaluations (`eval_*.json`) as a table: success per decoding."""
    from reflectrl.evaluation.report import BEFORE_RL_FILE

    rows = []
    for path in sorted(run_dir.glob("eval_*.json")):
        report = json.loads(path.read_text())
        policy = "before RL" if path.name == BEFORE_RL_FILE else "final"
        for decoding in ("greedy", "sampled"):
            s = report[decoding]["all"]
            low, high = s["success_ci95"]
            rows.append(
                f"| {path.name} | {policy} | {report['split']} | {decoding} | "
                f"{s['success_rate']:.3f} [{low:.3f}, {high:.3f}] | {s['episodes']} |"
            )
    if not rows:
        return ["The run has no held-out evaluation (`eval_*.json`)."]
    head = "| file | policy | split | decoding | success [95% CI] | episodes |"
    return [head, "|---|---|---|---|---|---|", *rows]
