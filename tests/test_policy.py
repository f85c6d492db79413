"""Model math without Ray: masking, dropout, critic context, trainable state, RLlib adapter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from reflectrl.config import load_config
from reflectrl.models.policy import OptionPolicy
from reflectrl.rollout.vector_env import ReflectRLVectorEnv
from reflectrl.text import prompts
from reflectrl.text.tokens import label_token_ids
from tests.helpers import perturb


@pytest.fixture(scope="module")
def policy(tiny_dir: Path, tokenizer: Any) -> OptionPolicy:
    ids = label_token_ids(tokenizer, "123456", prompts.ACTION_MARKER)
    policy = OptionPolicy(tiny_dir, ids, lora_target_modules=("q_proj", "v_proj"), seed=0)
    perturb(policy)
    return policy


@pytest.fixture(scope="module")
def batch(tokenizer: Any) -> dict[str, torch.Tensor]:
    config = load_config(None, ["policy.model=tiny", "reflection.enabled=false"])
    env = ReflectRLVectorEnv(config, tokenizer, None, num_envs=3)
    obs, _ = env.reset()
    return {k: torch.as_tensor(v) for k, v in obs.items()}


def test_masked_labels_get_zero_probability(policy: OptionPolicy, batch: dict) -> None:
    mask = batch["option_mask"].clone()
    mask[0, 3:] = 0
    logits, _ = policy(batch["input_ids"], batch["attention_mask"], mask)
    probs = logits.softmax(-1)
    assert torch.all(probs[0, 3:] == 0)
    assert torch.allclose(probs.sum(-1), torch.ones(3))
    entropy = torch.distributions.Categorical(logits=logits).entropy()
    assert torch.isfinite(entropy).all()


def test_scores_equal_the_lm_next_token_logits(policy: OptionPolicy, batch: dict) -> None:
    """The label logits are the LM's next-token logits at the last prompt token."""
    logits, _ = policy(batch["input_ids"], batch["attention_mask"], batch["option_mask"])
    with torch.no_grad():
        full = policy.lm(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    last = batch["attention_mask"].sum(1) - 1
    expected = full.logits[torch.arange(3), last][:, policy.label_ids]
    assert torch.allclose(logits, expected, atol=1e-5)


def test_train_mode_equals_eval_mode(policy: OptionPolicy, batch: dict) -> None:
    """Dropout is off everywhere, so rollout (eval) and update (train) probabilities agree."""
    args = (batch["input_ids"], batch["attention_mask"], batch["option_mask"])
    policy.eval()
    eval_logits, eval_values = policy(*args)
    policy.train()
    train_logits, train_values = policy(*args)
    policy.eval()
    assert torch.equal(eval_logits, train_logits) and torch.equal(eval_values, train_values)
    assert all(m.p == 0 for m in policy.modules() if isinstance(m, torch.nn.Dropout))


def test_critic_sees_the_whole_prompt_and_ignores_padding(
    policy: OptionPolicy, batch: dict
) -> None:
    ids, mask = batch["input_ids"][:1].clone(), batch["attention_mask"][:1]
    _, value = policy(ids, mask, batch["option_mask"][:1])
    changed = ids.clone()
    changed[0, 1] = (changed[0, 1] + 7) % 1000  # a token ~170 positions before the end
    _, value_changed = policy(changed, mask, batch["option_mask"][:1])
    assert not torch.allclose(value, value_changed)
    padded = ids.clone()
    padded[0, mask[0] == 0] = 5  # other pad ids: masked positions must not matter
    _, value_padded = policy(padded, mask, batch["option_mask"][:1])
    assert torch.allclose(value, value_padded, atol=1e-6)


def test_trainable_state_is_lora_and_value_head(policy: OptionPolicy, tmp_path: Path) -> None:
    lora = policy.lora_state()
    trainable = policy.trainable_state()
    assert lora and all("lora_" in k for k in lora)
    assert set(trainable) - set(lora) == {"value_head.weight", "value_head.bias"}
    requires_grad = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert requires_grad == set(trainable)
    policy.save_adapter(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_config.json").is_file()
    before = {k: v.clone() for k, v in trainable.items()}
    with torch.no_grad():
        for p in policy.parameters():
            if p.requires_grad:
                p.add_(1.0)
    policy.load_adapter(tmp_path / "adapter")
    after = policy.trainable_state()
    assert all(torch.equal(before[k], after[k]) for k in before)
    with pytest.raises(ValueError, match="does not have"):
        policy.load_trainable_state({"nope": np.zeros(1)})


def test_full_rl_trains_every_lm_weight_and_checkpoints_them(
    tiny_dir: Path, tokenizer: Any, batch: dict, tmp_path: Path
) -> None:
    """policy.rl_trainable=full: every LM weight is trainable, synced and checkpointed; a
    policy loaded from the checkpoint scores exactly as the trained one."""
    ids = label_token_ids(tokenizer, "123456", prompts.ACTION_MARKER)
    full = OptionPolicy(tiny_dir, ids, seed=0, train_base=True, value_head=False)
    assert full.value_head is None
    trainable = full.trainable_state()
    requires_grad = {n for n, p in full.named_parameters() if p.requires_grad}
    assert requires_grad <= set(trainable) and any("lora_" not in k for k in requires_grad)
    assert sum(p.numel() for n, p in full.named_parameters() if p.requires_grad) > 10 * sum(
        v.numel() for v in full.lora_state().values()
    )
    args = (batch["input_ids"], batch["attention_mask"], batch["option_mask"])
    logits, _ = full(*args)
    logits.logsumexp(-1).sum().backward()  # one gradient step on the base weights
    with torch.no_grad():
        for param in full.parameters():
            if param.grad is not None:
                param.add_(param.grad, alpha=-0.1)
    trained, _ = full(*args)
    full.save_adapter(tmp_path / "adapter")
    fresh = OptionPolicy(tiny_dir, ids, seed=0, train_base=True, value_head=False)
    assert not torch.allclose(fresh(*args)[0], trained, atol=1e-4)
    fresh.load_adapter(tmp_path / "adapter")
    torch.testing.assert_close(fresh(*args)[0], trained)


def build_module(tiny_dir: Path, tokenizer: Any, **options: Any) -> Any:
    import gymnasium as gym
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from reflectrl.config import load_config
    from reflectrl.rl.rl_module import ReflectRLModule, module_config

    ids = label_token_ids(tokenizer, "123456", prompts.ACTION_MARKER)
    obs_space = gym.spaces.Dict(
        {
            "input_ids": gym.spaces.Box(0, len(tokenizer) - 1, (384,), np.int64),
            "attention_mask": gym.spaces.Box(0, 1, (384,), np.int64),
            "option_mask": gym.spaces.Box(0.0, 1.0, (6,), np.float32),
            "live": gym.spaces.Box(0, 1, (1,), np.int64),
        }
    )
    settings = [f"policy.{key}={value}" for key, value in options.items()]
    config = load_config(
        None, ["policy.lora.r=4", "policy.lora.alpha=8", "policy.micro_batch_size=2", *settings]
    )
    model_config = module_config(config, tiny_dir, ids)
    spec = RLModuleSpec(
        module_class=ReflectRLModule,
        observation_space=obs_space,
        action_space=gym.spaces.Discrete(6),
        model_config=model_config,
    )
    return spec.build()


def test_rl_module_syncs_trainable_state_and_values_without_grad(
    tiny_dir: Path, tokenizer: Any, batch: dict
) -> None:
    from ray.rllib.core.columns import Columns

    from reflectrl.rl.rl_module import WEIGHTS_VERSION, state_nbytes

    learner, runner = build_module(tiny_dir, tokenizer), build_module(tiny_dir, tokenizer)
    sync = learner.get_state(inference_only=True)
    weights = {k for k in sync if k != WEIGHTS_VERSION}
    assert weights and all("lora_" in k or "value_head" in k for k in weights)
    assert "policy.value_head.weight" in sync  # workers compute the rollout values for GAE
    whole_module = sum(v.numel() * v.element_size() for v in learner.state_dict().values())
    assert state_nbytes(sync) * 50 < whole_module  # LoRA is a small fraction of the LM
    perturb(learner)
    learner.weights_version = 7
    runner.set_state(learner.get_state(inference_only=True))
    assert runner.weights_version == 7
    x = {Columns.OBS: batch}
    out_l = learner.forward_inference(x)
    out_r = runner.forward_inference(x)
    assert torch.equal(out_l[Columns.ACTION_DIST_INPUTS], out_r[Columns.ACTION_DIST_INPUTS])
    assert torch.equal(out_l[Columns.VF_PREDS], out_r[Columns.VF_PREDS])
    assert out_r[WEIGHTS_VERSION].tolist() == [7, 7, 7]
    explore = runner.forward_exploration(x)[Columns.ACTION_DIST_INPUTS]
    assert not out_r[Columns.ACTION_DIST_INPUTS].requires_grad and not explore.requires_grad
    values = learner.compute_values(x)  # the GAE connector's call: no grad, micro-batched
    assert values.shape == (3,) and not values.requires_grad
    train_out = learner.forward_train(x)
    with_grad = learner.compute_values(x, embeddings=train_out[Columns.EMBEDDINGS])
    assert with_grad.requires_grad and torch.allclose(with_grad, values, atol=1e-5)
    torch.testing.assert_close(out_l[Columns.VF_PREDS], values, atol=1e-5, rtol=1e-5)


def count_lm_rows(module: Any) -> list[int]:
    """Rows of every LM trunk call from now on that computes rows' own states (a forward hook
    on the decoder stack; a shared prompt prefix's one-row pass is not counted)."""
    seen: list[int] = []
    trunk = module.policy.lm.get_base_model().base_model

    def record(_m: Any, _args: Any, kwargs: dict, _out: Any) -> None:
        if kwargs.get("past_key_values") is not None or not kwargs.get("use_cache"):
            seen.append(kwargs["input_ids"].shape[0])

    trunk.register_forward_hook(record, with_kwargs=True)
    return seen


def test_rollouts_skip_the_lm_on_rows_that_are_not_live(
    tiny_dir: Path, tokenizer: Any, batch: dict
) -> None:
    from ray.rllib.core.columns import Columns

    module = build_module(tiny_dir, tokenizer)
    perturb(module)
    seen = count_lm_rows(module)
    live = {**batch, "live": torch.tensor([[1], [0], [1]])}
    out = module.forward_exploration({Columns.OBS: live})
    assert seen == [2]  # the episode's last observation never reached the LM
    full = module.forward_exploration({Columns.OBS: batch})
    logits = out[Columns.ACTION_DIST_INPUTS]
    torch.testing.assert_close(logits[[0, 2]], full[Columns.ACTION_DIST_INPUTS][[0, 2]])
    # The placeholder is uniform over the menu: a valid action, never a masked one.
    probs = logits[1].softmax(-1)
    torch.testing.assert_close(probs, batch["option_mask"][1] / batch["option_mask"][1].sum())


def test_gae_values_come_from_rollouts_only_when_the_weights_match(
    tiny_dir: Path, tokenizer: Any, batch: dict
) -> None:
    from ray.rllib.core.columns import Columns

    from reflectrl.rl.rl_module import WEIGHTS_VERSION

    module = build_module(tiny_dir, tokenizer)
    perturb(module)
    module.weights_version = 4
    exact = module.compute_values({Columns.OBS: batch})
    seen = count_lm_rows(module)
    rollout = torch.tensor([10.0, 20.0, 30.0])  # what the rollout said (sentinels)
    gae_batch = {
        Columns.OBS: batch,
        Columns.VF_PREDS: rollout,
        WEIGHTS_VERSION: torch.tensor([4, 3, 4]),  # row 1 was sampled with older weights
        Columns.LOSS_MASK: torch.tensor([True, True, False]),  # row 2 is a bootstrap row
    }
    values = module.compute_values(gae_batch)
    assert values[0] == 10.0  # reused
    torch.testing.assert_close(values[1:], exact[1:], atol=1e-5, rtol=1e-5)  # recomputed
    assert sum(seen) == 2
    off = build_module(tiny_dir, tokenizer, values_from_rollouts=False)
    perturb(off)
    torch.testing.assert_close(off.compute_values(gae_batch), exact, atol=1e-5, rtol=1e-5)


def test_trimming_padding_changes_no_logit_or_value(
    tiny_dir: Path, tokenizer: Any, batch: dict
) -> None:
    ids = label_token_ids(tokenizer, "123456", prompts.ACTION_MARKER)
    outputs = []
    for trim in (False, True):
        policy = OptionPolicy(tiny_dir, ids, seed=5, trim_padding=trim)
        perturb(policy)
        rows = [batch["input_ids"], batch["attention_mask"], batch["option_mask"]]
        # Rows of different lengths: the batch trims to its longest, not to each row's own.
        rows[1] = rows[1].clone()
        rows[1][0, int(rows[1][0].sum()) - 40 :] = 0
        outputs.append(policy(*rows))
    assert int(batch["attention_mask"].sum(1).max()) < batch["input_ids"].shape[1]  # padded
    torch.testing.assert_close(outputs[0][0], outputs[1][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outputs[0][1], outputs[1][1], atol=1e-5, rtol=1e-5)


def test_building_a_policy_leaves_the_global_random_stream_alone(
    tiny_dir: Path, tokenizer: Any
) -> None:
    # RLlib seeds each rollout worker's torch stream (seed + worker index) before building the
    # module; a global manual_seed in here made every worker sample the same actions.
    ids = label_token_ids(tokenizer, "123456", prompts.ACTION_MARKER)
    torch.manual_seed(1234)
    expected = torch.rand(3)
    torch.manual_seed(1234)
    first = OptionPolicy(tiny_dir, ids, seed=0)
    assert torch.equal(torch.rand(3), expected)
    second = OptionPolicy(tiny_dir, ids, seed=0)  # and the init is still seeded by the config
    assert all(torch.equal(v, second.lora_state()[k]) for k, v in first.lora_state().items())


def test_value_head_starts_at_zero(policy: OptionPolicy, batch: dict) -> None:
    fresh = OptionPolicy(policy.lm.get_base_model().name_or_path, policy.label_ids.tolist(), seed=9)
    _, values = fresh(batch["input_ids"], batch["attention_mask"], batch["option_mask"])
    assert torch.equal(values, torch.zeros(3))
    micro = fresh.values_in_micro_batches(batch["input_ids"], batch["attention_mask"], 2)
    assert torch.equal(micro, values)


def test_dropout_in_the_model_config_is_switched_off(
    tiny_dir: Path, tokenizer: Any, batch: dict, tmp_path: Path
) -> None:
    import json
    import shutil

    noisy = tmp_path / "noisy"
    shutil.copytree(tiny_dir, noisy)
    config = json.loads((noisy / "config.json").read_text())
    config["attention_dropout"] = 0.5
    (noisy / "config.json").write_text(json.dumps(config))
    ids = label_token_ids(tokenizer, "123456", prompts.ACTION_MARKER)
    policy = OptionPolicy(noisy, ids)
    policy.train()
    args = (batch["input_ids"], batch["attention_mask"], batch["option_mask"])
    first, _ = policy(*args)
    second, _ = policy(*args)
    assert torch.equal(first, second)


def test_gradient_checkpointing_changes_nothing_but_memory(
    tiny_dir: Path, tokenizer: Any, batch: dict
) -> None:
    ids = label_token_ids(tokenizer, "123456", prompts.ACTION_MARKER)
    grads = []
    for checkpointing in (False, True):
        policy = OptionPolicy(tiny_dir, ids, seed=3, gradient_checkpointing=checkpointing)
        policy.train()
        logits, values = policy(batch["input_ids"], batch["attention_mask"], batch["option_mask"])
        (logits.logsumexp(-1).sum() + values.sum()).backward()
        grads.append({n: p.grad.clone() for n, p in policy.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-6, rtol=1e-5)
    assert policy.lm.get_base_model().is_gradient_checkpointing


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory: pytest.TempPathFactory, tokenizer: Any) -> Path:
    from reflectrl.models.loading import save_random_gpt2

    out = tmp_path_factory.mktemp("gpt2")
    save_random_gpt2(tokenizer, out)
    return out


@pytest.mark.parametrize(
    ("arch", "targets"), [("llama", ("q_proj", "v_proj")), ("gpt2", ("c_attn", "c_proj", "c_fc"))]
)
def test_a_shared_prefix_runs_once_and_changes_nothing(
    arch: str, targets: tuple[str, ...], request: pytest.FixtureRequest, tokenizer: Any
) -> None:
    """Rows that start alike: the prefix goes through the LM once; logits, values and
    gradients equal the plain forward's (also when only part of the batch shares a prefix).
    GPT-2 too: its learned positions must continue after the cached prefix."""
    from reflectrl.models.policy import MIN_SHARED_PREFIX, shared_prefix_length

    ids = label_token_ids(tokenizer, "123456", prompts.ACTION_MARKER)
    model_dir = request.getfixturevalue("tiny_dir" if arch == "llama" else "gpt2_dir")
    policy = OptionPolicy(model_dir, ids, lora_target_modules=targets, seed=2)
    perturb(policy)  # a LoRA that is not zero, so its gradients mean something
    gen = torch.Generator().manual_seed(0)
    head = torch.randint(5, 900, (20,), generator=gen)
    rows, lengths = [], [31, 26, 40, 23]
    for n in lengths:
        rows.append(torch.cat([head, torch.randint(5, 900, (n - 20,), generator=gen)]))
    input_ids = torch.zeros(4, 48, dtype=torch.long)
    mask = torch.zeros(4, 48, dtype=torch.long)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)], mask[i, : len(row)] = row, 1
    options = torch.ones(4, 6)
    options[1, 4:] = 0
    assert shared_prefix_length(input_ids, mask.sum(1)) == 20 >= MIN_SHARED_PREFIX
    mixed = input_ids.clone()
    mixed[3, 10] += 1  # row 3 parts from the others at token 10: the shared prefix shrinks

    def outputs(share: bool, batch: torch.Tensor) -> tuple[torch.Tensor, ...]:
        policy.share_prefix = share
        policy.zero_grad()
        logits, values = policy(batch, mask, options)
        (logits.log_softmax(-1)[:, 0].sum() + values.sum()).backward()
        grads = [p.grad.clone() for p in policy.parameters() if p.requires_grad]
        return (logits.detach(), values.detach(), *grads)

    for batch in (input_ids, mixed):
        plain, shared = outputs(False, batch), outputs(True, batch)
        for a, b in zip(plain, shared, strict=True):
            assert torch.allclose(a, b, atol=1e-5, rtol=1e-4)
    assert shared_prefix_length(mixed, mask.sum(1)) == 10
    assert shared_prefix_length(input_ids[:1], mask[:1].sum(1)) == 0  # one row: nothing shared
