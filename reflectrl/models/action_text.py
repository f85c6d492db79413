"""The text action head: each valid action scored by the log-probability of its own tokens.

The label head (models/policy.py) reads one next-token logit per menu label. This head, as in
TWOSOME (Tan et al., ICLR 2024) and GLAM (Carta et al., ICML 2023), scores action k by

    log p(a_k | prompt) = sum_t log p(a_k[t] | prompt, a_k[:t])

divided by its token count (`token`), its word count (`word`) or by 1 (`none`), and the
policy is the softmax of those scores over the valid actions. Following a hint then means
copying the hinted text, token by token, from where the reflection wrote it (an induction
copy), not finding the hinted line on the menu and reading the label in front of it.

Cost: one LM pass per row over the prompt followed by every action's tokens, packed with no
padding between them (a tree: each action attends to the prompt and to its own earlier tokens
only, through a 4D attention mask, and takes the positions that follow the prompt). So the
prompt is read once, whatever K is, and the pass costs the prompt plus the menu's tokens,
not K prompts.
No Ray here: plain torch over a Hugging Face decoder.
"""

from __future__ import annotations

from typing import Any, Literal

import torch

Normalisation = Literal["token", "word", "none"]
NORMALISATIONS: tuple[str, ...] = ("token", "word", "none")
# Logit of an action that is not valid now (as the label head's MASKED_LOGIT).
MASKED_LOGIT = -1e9


def action_log_probs(
    trunk: Any,
    head: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    action_ids: torch.Tensor,
    action_mask: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed log-probability of each action's tokens after its row's prompt [B, K], the
    final hidden state at each prompt's last real token [B, H], what a value head reads).

    input_ids, attention_mask: [B, T], right-padded prompts. action_ids, action_mask:
    [B, K, L], each action's tokens right-padded to L (an action with no tokens scores 0;
    reflectrl.text.tokens.encode_action_texts makes them). `trunk` is the decoder stack (no
    LM head), `head` the LM's output embeddings."""
    rows, actions, width_a = action_ids.shape
    lengths = attention_mask.long().sum(dim=1)
    if bool((lengths < 1).any()):
        raise ValueError("an observation has an empty attention mask")
    width = int(lengths.max())
    device = input_ids.device
    # The tokens that predict each action's later tokens: a_k[:-1], for every k, packed side
    # by side after the prompt with no padding between actions (menus differ in length and
    # most actions are far shorter than the longest); the prompt's last token predicts every
    # a_k[0]. Row b's fed token j is token `step` of action `branch`.
    fed = action_mask[:, :, 1:].bool().reshape(rows, -1)  # token t is fed if t + 1 exists
    packed = int(fed.sum(dim=1).max()) if fed.numel() else 0
    row_of, flat = fed.nonzero(as_tuple=True)
    slot = (fed.long().cumsum(dim=1) - 1)[row_of, flat]
    branch_of, step_of = flat // max(width_a - 1, 1), flat % max(width_a - 1, 1)
    tokens = input_ids.new_zeros(rows, packed)
    tokens[row_of, slot] = action_ids[row_of, branch_of, step_of]
    step = torch.zeros(rows, packed, dtype=torch.long, device=device)
    step[row_of, slot] = step_of
    branch = torch.full((rows, packed), -1, dtype=torch.long, device=device)  # -1: padding
    branch[row_of, slot] = branch_of
    positions = torch.cat(
        [torch.arange(width, device=device).expand(rows, width), lengths[:, None] + step], dim=1
    )
    out = trunk(
        input_ids=torch.cat([input_ids[:, :width], tokens], dim=1),
        attention_mask=tree_mask(attention_mask[:, :width], step, branch, trunk.dtype),
        position_ids=positions,
        use_cache=False,
    ).last_hidden_state
    last = out[torch.arange(rows, device=device), lengths - 1]
    first = _log_softmax(head, last).gather(1, action_ids[:, :, 0])  # [B, K]
    total = (first * action_mask[:, :, 0]).reshape(-1)
    if packed == 0:
        return total.view(rows, actions), last
    # Only the fed tokens reach the vocabulary head, each scoring the next token of its action.
    logp = _log_softmax(head, out[:, width:][row_of, slot])
    rest = logp.gather(1, action_ids[row_of, branch_of, step_of + 1][:, None]).squeeze(1)
    total = total.index_add(0, row_of * actions + branch_of, rest.to(total.dtype))
    return total.view(rows, actions), last


def tree_mask(
    prompt_mask: torch.Tensor, step: torch.Tensor, branch: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """The additive 4D attention mask [B, 1, W + M, W + M] of prompts (width W, right-padded)
    followed by M packed action tokens (in row b, token `step[b, j]` of action `branch[b, j]`;
    branch -1 is padding): a prompt token sees the prompt's real tokens up to itself; an
    action token sees the prompt's real tokens and its own action's tokens up to itself."""
    rows, width = prompt_mask.shape
    real = prompt_mask.bool()
    causal = torch.ones(width, width, dtype=torch.bool, device=real.device).tril()
    prompt_rows = causal[None] & real[:, None, :]  # [B, W, W]
    same_action = (branch[:, :, None] == branch[:, None, :]) & (
        step[:, None, :] <= step[:, :, None]
    )  # [B, M, M]
    tokens = step.shape[1]
    allowed = torch.cat(
        [
            torch.cat([prompt_rows, prompt_rows.new_zeros(rows, width, tokens)], dim=2),
            torch.cat([real[:, None, :].expand(rows, tokens, width), same_action], dim=2),
        ],
        dim=1,
    )
    additive = torch.zeros(allowed.shape, dtype=dtype, device=real.device)
    return additive.masked_fill(~allowed, torch.finfo(dtype).min)[:, None]


def action_scores(
    log_probs: torch.Tensor,
    action_mask: torch.Tensor,
    word_counts: torch.Tensor,
    option_mask: torch.Tensor,
    normalisation: Normalisation,
) -> torch.Tensor:
    """The categorical's logits over the K actions: [B, K], invalid actions masked.

    log_probs: [B, K] from `action_log_probs`; word_counts: [B, K] words in each action's
    text (for `word`); option_mask: [B, K], 1 where the action is valid now."""
    if normalisation == "token":
        divisor = action_mask.sum(dim=-1).clamp(min=1)
    elif normalisation == "word":
        divisor = word_counts.clamp(min=1)
    elif normalisation == "none":
        divisor = torch.ones_like(log_probs)
    else:
        raise ValueError(f"unknown normalisation {normalisation!r}; use one of {NORMALISATIONS}")
    scores = log_probs.float() / divisor.to(torch.float32)
    return scores.masked_fill(option_mask <= 0, MASKED_LOGIT)


def _log_softmax(head: Any, hidden: torch.Tensor) -> torch.Tensor:
    """Log-probabilities over the vocabulary, in float32."""
    return torch.log_softmax(head(hidden).float(), dim=-1)
