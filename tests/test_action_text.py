"""The text action head's math against a brute-force full forward of prompt + action."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, GPT2Config

from reflectrl.models.action_text import action_log_probs, action_scores
from reflectrl.models.loading import load_causal_lm
from reflectrl.text.tokens import encode_action_texts

PROMPTS = [
    "Find the file. Hint: cat utils.py # Action:\n",
    "Go. # Action:\n",
    "A longer prompt than the others, with more tokens in it before the answer. # Action:\n",
]
ACTIONS = [
    ["cat utils.py", "ls", "cd tests/unit"],
    ["ls"],
    ["open the drawer 2", "go to fridge 1"],
]


def encode_actions(tokenizer: Any, rows: list[list[str]], width: int) -> list[torch.Tensor]:
    return [torch.as_tensor(a) for a in encode_action_texts(tokenizer, rows, width, 16)]


def brute_force(model: Any, tokenizer: Any, prompt: str, action: str) -> float:
    """log p(" action" EOS | prompt), one full forward of the concatenated tokens."""
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    action_ids = tokenizer.encode(" " + action, add_special_tokens=False)
    action_ids.append(tokenizer.eos_token_id)
    x = torch.tensor([prompt_ids + action_ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=x).logits[0].float(), dim=-1)
    return float(sum(logp[len(prompt_ids) - 1 + t, a] for t, a in enumerate(action_ids)))


def padded_prompts(tokenizer: Any) -> tuple[torch.Tensor, torch.Tensor]:
    ids = [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    width = max(map(len, ids)) + 3  # right padding beyond the longest, as rollouts send
    x = torch.full((len(ids), width), tokenizer.pad_token_id or 0)
    mask = torch.zeros_like(x)
    for i, row in enumerate(ids):
        x[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    return x, mask


def gpt2_model(vocab: int) -> Any:
    config = GPT2Config(vocab_size=vocab, n_embd=64, n_layer=2, n_head=2, n_positions=256,
                        resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)  # fmt: skip
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("trunk", ["llama", "gpt2"])
def test_log_probs_match_a_full_forward(trunk: str, tiny_dir: Path, tokenizer: Any) -> None:
    """Cached prompt + batched continuations == one forward of prompt + action, for RoPE
    (Llama) and learned absolute positions (GPT-2), with padded prompts and actions."""
    model = load_causal_lm(tiny_dir).eval() if trunk == "llama" else gpt2_model(len(tokenizer))
    x, mask = padded_prompts(tokenizer)
    action_ids, action_mask, _ = encode_actions(tokenizer, ACTIONS, width=4)
    with torch.no_grad():
        got, last = action_log_probs(model.base_model, model.get_output_embeddings(), x, mask,
                               action_ids, action_mask)  # fmt: skip
    for i, row in enumerate(ACTIONS):
        for k, action in enumerate(row):
            want = brute_force(model, tokenizer, PROMPTS[i], action)
            assert got[i, k].item() == pytest.approx(want, abs=1e-4), (i, action)
        assert torch.all(got[i, len(row) :] == 0)  # empty slots score 0
    with torch.no_grad():  # the value head's input: the prompt's last real token
        want_last = model.base_model(input_ids=x, attention_mask=mask).last_hidden_state
    ends = mask.sum(1) - 1
    assert torch.allclose(last, want_last[torch.arange(len(PROMPTS)), ends], atol=1e-5)


def test_gradients_reach_the_shared_prompt(tokenizer: Any) -> None:
    """The prompt runs once; the loss on later action tokens still trains what reads it."""
    model = gpt2_model(len(tokenizer))
    x, mask = padded_prompts(tokenizer)
    action_ids, action_mask, _ = encode_actions(tokenizer, ACTIONS, width=3)
    log_probs, _ = action_log_probs(model.base_model, model.get_output_embeddings(), x, mask,
                                 action_ids, action_mask)  # fmt: skip
    log_probs[0, 0].backward()
    grad = model.base_model.wte.weight.grad
    prompt_token = x[0, 0]
    assert grad is not None and grad[prompt_token].abs().sum() > 0


def test_normalisations_and_mask() -> None:
    log_probs = torch.tensor([[-6.0, -2.0, -9.0]])
    action_mask = torch.tensor([[[1, 1, 1], [1, 0, 0], [1, 1, 1]]])
    words = torch.tensor([[2.0, 1.0, 3.0]])
    valid = torch.tensor([[1, 1, 0]])
    token = action_scores(log_probs, action_mask, words, valid, "token")
    assert token[0, :2].tolist() == [-2.0, -2.0] and token[0, 2] == -1e9
    word = action_scores(log_probs, action_mask, words, valid, "word")
    assert word[0, :2].tolist() == [-3.0, -2.0]
    none = action_scores(log_probs, action_mask, words, valid, "none")
    assert none[0, :2].tolist() == [-6.0, -2.0]
    with pytest.raises(ValueError, match="unknown normalisation"):
        action_scores(log_probs, action_mask, words, valid, "chars")  # type: ignore[arg-type]


def test_action_texts_end_with_eos_and_are_cut(tokenizer: Any) -> None:
    ids, mask, words = encode_action_texts(tokenizer, [["go to fridge 1", "look"]], 3, 2)
    assert mask[0].sum(-1).tolist() == [2, 2, 0]
    assert words[0].tolist() == [4.0, 1.0, 0.0]
    look = tokenizer.encode(" look", add_special_tokens=False)
    assert ids[0, 1].tolist() == [*look, tokenizer.eos_token_id][:2]
    with pytest.raises(ValueError, match="do not fit"):
        encode_action_texts(tokenizer, [["a", "b"]], 1, 2)


# --- the head in the vector env, the policy, SFT and the config ------------------------------


@pytest.fixture(scope="module")
def text_env(tokenizer: Any) -> Any:
    from reflectrl.config import load_config
    from reflectrl.rollout.vector_env import ReflectRLVectorEnv

    overrides = ["policy.model=tiny", "reflection.enabled=false", "policy.action_head=text",
                 "env.shuffle_options=true"]  # fmt: skip
    config = load_config(None, overrides)
    return ReflectRLVectorEnv(config, tokenizer, None, num_envs=3)


def test_vector_env_sends_each_menu_slot_s_text(text_env: Any, tokenizer: Any) -> None:
    """Slot i holds the action the menu's line i shows (the menu is shuffled here), as
    ` <action>` + EOS."""
    obs, _ = text_env.reset(seed=0)
    assert obs["action_ids"].shape == (3, text_env.max_actions, 24)
    assert text_env.observation_space.contains(obs)
    for i, prompt in enumerate(text_env.last_prompts):
        menu = prompt.rsplit("Valid actions:\n", 1)[1].removesuffix(" # Action:\n").split("\n")
        for slot, line in enumerate(menu):
            ids = obs["action_ids"][i, slot][obs["action_mask"][i, slot] > 0].tolist()
            assert ids[-1] == tokenizer.eos_token_id
            assert tokenizer.decode(ids[:-1]) == " " + line.split(". ", 1)[1]
            assert obs["action_words"][i, slot] == len(line.split(". ", 1)[1].split())
        assert obs["action_mask"][i, len(menu) :].sum() == 0


def test_without_the_menu_the_prompt_drops_it_and_the_slots_stay(tokenizer: Any) -> None:
    """policy.show_menu=false: the same prompts less "Valid actions:" and the menu's lines, and
    the same action slots (fresh envs of the same run.seed: the same starts and shuffles)."""
    from reflectrl.config import load_config
    from reflectrl.rollout.vector_env import ReflectRLVectorEnv

    overrides = ["policy.model=tiny", "reflection.enabled=false", "policy.action_head=text",
                 "env.shuffle_options=true"]  # fmt: skip
    configs = [load_config(None, [*overrides, f"policy.show_menu={s}"]) for s in ("1", "0")]
    envs = [ReflectRLVectorEnv(config, tokenizer, None, num_envs=3) for config in configs]
    (with_menu, _), (without, _) = (env.reset() for env in envs)
    text_env, bare = envs
    for key in ("action_ids", "action_mask", "action_words", "option_mask"):
        assert (with_menu[key] == without[key]).all(), key
    for shown, hidden in zip(text_env.last_prompts, bare.last_prompts, strict=True):
        assert "Valid actions:" not in hidden and hidden.endswith(" # Action:\n")
        assert hidden == shown.rsplit("\nValid actions:\n", 1)[0] + " # Action:\n"
    assert (without["attention_mask"].sum(1) < with_menu["attention_mask"].sum(1)).all()


def test_policy_text_head_scores_the_menu_by_its_text(text_env: Any, tiny_dir: Path) -> None:
    """OptionPolicy with the text head: the logit of slot k is log p(action k | prompt) per
    token, by a full forward of the prompt and that action; invalid slots masked; V(s) reads
    the prompt's last token."""
    from reflectrl.models.policy import OptionPolicy
    from tests.helpers import perturb

    policy = OptionPolicy(tiny_dir, list(range(text_env.max_actions)), action_head="text")
    perturb(policy)
    obs, _ = text_env.reset(seed=1)
    batch = {k: torch.as_tensor(v) for k, v in obs.items()}
    with torch.no_grad():
        logits, hidden = policy.logits_and_hidden(batch)
        lm = policy.lm
        for i in range(3):
            n = int(batch["attention_mask"][i].sum())
            prompt = batch["input_ids"][i, :n].tolist()
            for k in range(text_env.max_actions):
                if batch["option_mask"][i, k] == 0:
                    assert logits[i, k] == -1e9
                    continue
                action = batch["action_ids"][i, k][batch["action_mask"][i, k] > 0].tolist()
                out = lm(input_ids=torch.tensor([prompt + action])).logits[0].float()
                logp = torch.log_softmax(out, -1)
                want = sum(logp[n - 1 + t, a] for t, a in enumerate(action)) / len(action)
                assert logits[i, k].item() == pytest.approx(float(want), abs=1e-4)
    assert torch.allclose(hidden, policy.encode(batch["input_ids"], batch["attention_mask"]),
                          atol=1e-5)  # fmt: skip


def test_sft_rows_train_the_chosen_action_s_text(tokenizer: Any) -> None:
    from reflectrl.errors import ConfigError
    from reflectrl.sft.rows import IGNORE, encode_rows

    prompt = "Task # Analyze:\ngo east\nValid actions:\n1. go west\n2. go east # Action:\n"
    rows = [{"prompt": prompt, "completion": "2"}]
    encoded = encode_rows(rows, tokenizer, 512, single_token=True, action_max_tokens=24)
    labels = [t for t in encoded.examples[0]["labels"] if t != IGNORE]
    want = [*tokenizer.encode(" go east", add_special_tokens=False), tokenizer.eos_token_id]
    assert labels == want
    label_head = encode_rows(rows, tokenizer, 512, single_token=True)
    assert len([t for t in label_head.examples[0]["labels"] if t != IGNORE]) == 2  # "2", EOS
    with pytest.raises(ConfigError, match="not a label on its prompt's menu"):
        encode_rows([{"prompt": prompt, "completion": "7"}], tokenizer, 512, True, 24)
    # Without the menu in the prompt (policy.show_menu=false): the expert's recorded action.
    bare = {"prompt": "Task # Analyze:\ngo east # Action:\n", "completion": "2",
            "expert_action": "go east"}  # fmt: skip
    encoded = encode_rows([bare], tokenizer, 512, single_token=True, action_max_tokens=24)
    assert [t for t in encoded.examples[0]["labels"] if t != IGNORE] == want


def test_gradient_checkpointing_changes_nothing_under_the_text_head(
    text_env: Any, tiny_dir: Path
) -> None:
    """The tree pass runs without a cache, so checkpointed layers recompute it exactly."""
    from reflectrl.models.policy import OptionPolicy

    obs, _ = text_env.reset(seed=2)
    batch = {k: torch.as_tensor(v) for k, v in obs.items()}
    grads = []
    for checkpointing in (False, True):
        policy = OptionPolicy(tiny_dir, list(range(text_env.max_actions)), seed=3,
                              gradient_checkpointing=checkpointing, action_head="text")  # fmt: skip
        policy.train()
        logits, hidden = policy.logits_and_hidden(batch)
        (logits.masked_fill(batch["option_mask"] == 0, 0).sum() + hidden.sum()).backward()
        named = policy.named_parameters()
        grads.append({n: p.grad.clone() for n, p in named if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[0][name], grads[1][name], atol=1e-6, rtol=1e-5)
