"""Train one player on its SFT rows with TRL's `SFTTrainer`: a peft LoRA adapter, or all
weights (`sft.method: full`, for small models trained from scratch).

Output, per player, `OUT/<player>/`:
    lora  a peft adapter (adapter_config.json + adapter_model.safetensors): the policy loads it
          with `policy.init_adapter`, the reflection server serves it with `reflection.adapter`
    full  a model directory (weights, config, tokenizer) usable as `policy.model` /
          `reflection.model`
and `sft_result.json` (losses, steps, time), written last: a folder without it is unfinished.
The folder is built under a temporary name and renamed when complete, so a crash never
leaves a half-written adapter where a finished one is expected.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from reflectrl.atomic_files import atomic_dir, write_json
from reflectrl.config import LoraSettings, ReflectRLConfig
from reflectrl.data.scratch import resolve_or_build
from reflectrl.errors import ConfigError
from reflectrl.models.loading import load_causal_lm, load_tokenizer
from reflectrl.sft.rows import IGNORE, Player, encode_rows, load_rows, target_of
from reflectrl.trackers import Trackers, numbers

RESULT_FILE = "sft_result.json"
# Rows of the training set whose loss is measured before and after (a fixed, seeded sample).
TRAIN_LOSS_ROWS = 64


def completion_loss(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    labels: torch.Tensor,
    num_items: int | torch.Tensor | None = None,
    loss_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """The causal-LM loss over the completion tokens (labels != IGNORE), multiplying the LM
    head only at the positions that predict them.

    Equal to the model's own loss with these labels, but a policy row has one label token in
    ~200 and the head of a 49k vocabulary dominates a small model's cost: the full logits were
    most of the work. `num_items`: the token count to average over (Trainer passes it so
    gradient accumulation weighs tokens equally); by default this batch's. `loss_weights` (one
    per label): the batch's weighted mean instead (`sft.reflection_command_weight`).
    """
    from peft import PeftModel

    causal = model.get_base_model() if isinstance(model, PeftModel) else model
    trunk = causal.base_model  # the decoder stack; LoRA layers are injected into it in place
    hidden = trunk(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    targets = labels[:, 1:]  # position t predicts token t + 1
    keep = targets != IGNORE
    logits = causal.get_output_embeddings()(hidden.last_hidden_state[:, :-1][keep])
    if loss_weights is not None:
        weights = loss_weights[:, 1:][keep]
        losses = torch.nn.functional.cross_entropy(logits.float(), targets[keep], reduction="none")
        return (losses * weights).sum() / weights.sum()
    total = torch.nn.functional.cross_entropy(logits.float(), targets[keep], reduction="sum")
    return total / (keep.sum() if num_items is None else num_items)


class WeightedBatches:
    """TRL's collator, plus the rows' `loss_weights` padded with 0 (TRL's drops other keys)."""

    def __init__(self, collate: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> None:
        self.collate = collate

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        batch = self.collate(
            [{k: v for k, v in row.items() if k != "loss_weights"} for row in examples]
        )
        if "loss_weights" in examples[0]:
            weights = torch.zeros(batch["labels"].shape, dtype=torch.float32)
            for i, row in enumerate(examples):
                weights[i, : len(row["loss_weights"])] = torch.tensor(row["loss_weights"])
            batch["loss_weights"] = weights
        return batch


def finished(out: Path, player: Player) -> dict[str, Any] | None:
    """The result of a finished SFT of `player` under `out`, or None."""
    result = out / player / RESULT_FILE
    return json.loads(result.read_text()) if result.is_file() else None


def _trainer_class() -> type:
    from trl import SFTTrainer

    class CompletionLossTrainer(SFTTrainer):
        """TRL's SFT loop with `completion_loss` (single device: the model is unwrapped)."""

        def compute_loss(
            self,
            model: torch.nn.Module,
            inputs: dict[str, torch.Tensor],
            return_outputs: bool = False,
            num_items_in_batch: int | torch.Tensor | None = None,
        ) -> Any:
            # The weights shape training only: the held-out loss stays the plain one.
            weights = inputs.get("loss_weights") if model.training else None
            loss = completion_loss(
                self.accelerator.unwrap_model(model),
                inputs["input_ids"],
                inputs["attention_mask"],
                inputs["labels"],
                num_items_in_batch,
                weights,
            )
            return (loss, {"loss": loss}) if return_outputs else loss

    return CompletionLossTrainer


def print_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def progress_lines(name: str, emit: Callable[[str], None] = print_line) -> Any:
    """A callback emitting `name: step k/n, loss x (elapsed, ETA)` at each logging step."""
    from transformers import TrainerCallback

    class ProgressLines(TrainerCallback):
        started: float | None = None  # None outside train(): the losses measured around it

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.started = time.perf_counter()

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.started = None

        def on_log(
            self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any
        ) -> None:
            if self.started is None:
                return
            logs = logs or {}
            elapsed = time.perf_counter() - self.started
            step, total = state.global_step, state.max_steps
            left = elapsed / step * (total - step) if step else 0.0
            if "loss" in logs:
                what = f"loss {float(logs['loss']):.3f}"
            elif "eval_loss" in logs:
                what = f"held-out loss {float(logs['eval_loss']):.3f}"
            else:
                return
            emit(f"{name}: step {step}/{total}, {what} ({elapsed:.0f} s, ~{left:.0f} s left)")

    return ProgressLines()


def tracker_logs(trackers: Trackers, player: str) -> Any:
    """A callback sending TRL's log lines during training to the run's MLflow / W&B trackers
    as `sft/<player>/<key>`. Not TRL's own `report_to` integrations: the two players log into
    one run, where theirs would log each player's TrainingArguments as params (MLflow refuses
    a param that changes), give both players' losses the same names, and end the run when
    training ends."""
    from transformers import TrainerCallback

    class TrackerLogs(TrainerCallback):
        training = False  # the losses measured around train() are logged from its result

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.training = True

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.training = False

        def on_log(
            self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any
        ) -> None:
            if self.training and state.is_world_process_zero:
                trackers.log_metrics(numbers(logs or {}, f"sft/{player}/"), state.global_step)

    return TrackerLogs()


def player_model(config: ReflectRLConfig, player: Player) -> tuple[str, LoraSettings]:
    if player == "policy":
        return config.policy.model, config.policy.lora
    return config.reflection.model, config.reflection.lora


def build_model(model_dir: Path, method: str, lora: LoraSettings, seed: int) -> torch.nn.Module:
    """The LM to train: a fresh LoRA over frozen weights, or every weight trainable."""
    from peft import LoraConfig, get_peft_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = load_causal_lm(model_dir)
        if method == "full":
            return model
        config = LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            target_modules=list(lora.target_modules),
            lora_dropout=0.0,
            bias="none",
            task_type="CAUSAL_LM",
        )
        return get_peft_model(model, config)


@dataclass
class SFTJob:
    """A ready TRL trainer for one player, and what its result record needs."""

    trainer: Any
    model: torch.nn.Module
    tokenizer: Any
    train_set: Any
    eval_set: Any
    target: str
    model_dir: Path
    skipped: int
    seed: int


def build_trainer(
    config: ReflectRLConfig,
    data_dir: Path,
    player: Player,
    workdir: Path,
    progress: bool = True,
    full_logits: bool = False,
    emit: Callable[[str], None] = print_line,
    trackers: Trackers | None = None,
) -> SFTJob:
    """The trainer for `player` on `data_dir` (TRL writes under `workdir`). `full_logits`:
    TRL's own loss over the full-vocabulary logits (only to measure what ours saves).
    `trackers`: the run's MLflow / W&B trackers, which get the training log lines."""
    from datasets import Dataset
    from transformers import PrinterCallback
    from trl import SFTConfig, SFTTrainer

    settings = config.sft
    seed = config.run.seed if settings.seed is None else settings.seed
    spec, lora = player_model(config, player)
    model_dir = resolve_or_build(spec)
    tokenizer = load_tokenizer(model_dir)
    target = target_of(player, config.reflection.enabled)
    train_rows, eval_rows = load_rows(data_dir, target)
    if player == "policy":
        budget = config.env.max_prompt_tokens
    else:
        budget = config.reflection.max_model_len - config.reflection.max_tokens
    single = player == "policy"
    text_head = single and config.policy.action_head == "text"
    action_tokens = config.policy.action_max_tokens if text_head else None
    weight = settings.reflection_command_weight if player == "reflection" else 1.0
    train = encode_rows(train_rows, tokenizer, budget, single, action_tokens, weight)
    held = encode_rows(eval_rows, tokenizer, budget, single, action_tokens)
    if not train.examples:
        raise ConfigError(f"every {target} row is longer than {budget} tokens; raise the budget")
    model = build_model(model_dir, settings.method, lora, seed)
    cuda = torch.cuda.is_available()
    args = SFTConfig(
        output_dir=str(workdir),
        per_device_train_batch_size=settings.batch_size,
        per_device_eval_batch_size=settings.batch_size,
        learning_rate=settings.lr,
        num_train_epochs=settings.epochs,
        max_steps=settings.max_steps_of(player) or -1,
        lr_scheduler_type="cosine",
        warmup_steps=settings.warmup_steps,
        logging_steps=settings.logging_steps,
        eval_strategy="steps" if held.examples else "no",
        eval_steps=settings.eval_steps,
        save_strategy="no",
        report_to=[],
        seed=seed,
        data_seed=seed,
        bf16=cuda and torch.cuda.is_bf16_supported(),
        use_cpu=not cuda,
        gradient_checkpointing=config.policy.gradient_checkpointing,
        max_length=None,  # rows are already fitted to the player's budget
        dataset_kwargs={"skip_prepare_dataset": True},
        # A bar on a terminal; elsewhere (a Ray task, a log file) one line per logging step.
        disable_tqdm=not (progress and sys.stderr.isatty()),
        prediction_loss_only=True,
        remove_unused_columns=False,  # keeps `loss_weights`; the rows hold nothing else extra
    )
    train_set = Dataset.from_list(train.examples)
    eval_set = Dataset.from_list(held.examples) if held.examples else None
    trainer_class = SFTTrainer if full_logits else _trainer_class()
    trainer = trainer_class(
        model=model,
        args=args,
        train_dataset=train_set,
        eval_dataset=eval_set,
        processing_class=tokenizer,
    )
    trainer.data_collator = WeightedBatches(trainer.data_collator)
    if args.disable_tqdm:
        trainer.remove_callback(PrinterCallback)  # it prints raw log dicts
        if progress:
            trainer.add_callback(progress_lines(f"sft {player}", emit))
    if trackers is not None:
        trainer.add_callback(tracker_logs(trackers, player))
    skipped = train.skipped + held.skipped
    return SFTJob(trainer, model, tokenizer, train_set, eval_set, target, model_dir, skipped, seed)


def train_player(
    config: ReflectRLConfig,
    data_dir: Path,
    player: Player,
    out: Path,
    progress: bool = True,
    emit: Callable[[str], None] = print_line,
    trackers: Trackers | None = None,
) -> dict[str, Any]:
    """SFT of `player` on `data_dir`, saved to `out/<player>`; returns the result record.
    Progress goes to `emit` (a bar instead on a terminal); TRL's log lines to `trackers` (the
    run's MLflow / W&B trackers), if given."""
    final = out / player
    if final.exists():
        raise ConfigError(f"--out {out}: {final} already exists; choose another folder")
    # Built aside and renamed into place: `out/<player>` exists only complete.
    with atomic_dir(final) as tmp:
        job = build_trainer(
            config, data_dir, player, tmp / "trainer", progress, emit=emit, trackers=trackers
        )
        trainer, seed = job.trainer, job.seed
        sample = job.train_set.shuffle(seed=seed)
        sample = sample.select(range(min(TRAIN_LOSS_ROWS, len(sample))))

        def losses() -> dict[str, float]:
            found = {"train": trainer.evaluate(sample)["eval_loss"]}
            if job.eval_set is not None:
                found["eval"] = trainer.evaluate(job.eval_set)["eval_loss"]
            return found

        before = losses()
        started = time.perf_counter()
        output = trainer.train()
        seconds = time.perf_counter() - started
        after = losses()

        shutil.rmtree(tmp / "trainer", ignore_errors=True)
        job.model.save_pretrained(str(tmp))
        if config.sft.method == "full":
            job.tokenizer.save_pretrained(str(tmp))
        result = {
            "player": player,
            "target": job.target,
            "method": config.sft.method,
            "base_model": str(job.model_dir),
            "rows": len(job.train_set),
            "eval_rows": 0 if job.eval_set is None else len(job.eval_set),
            "skipped_rows": job.skipped,
            "steps": int(output.global_step),
            "seconds": round(seconds, 2),
            "seed": seed,
            "loss_before": before,
            "loss_after": after,
        }
        write_json(tmp / RESULT_FILE, result)
    return result
