"""`reflectrl play`: watch a run's final players on held-out episodes, step by step.

Each step shows what the policy saw (the observation and the reflection), the menu with the
policy's probability of every action, the action it took and the reward. The episodes start
from the held-out starts `reflectrl eval` plays (eval.split, eval.seed), through the same vector
env, prompts and reflection server, here in this process with one env slot. `--html FILE`
writes them as one self-contained page (play_page.py).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from reflectrl.config import add_config_arguments
from reflectrl.errors import ConfigError

if TYPE_CHECKING:  # torch and the rollout stack load inside the handler: `--help` stays fast
    from reflectrl.models.policy import OptionPolicy
    from reflectrl.rollout.vector_env import ReflectRLVectorEnv


@dataclass(frozen=True)
class PlayedStep:
    observation: str
    reflection: str | None  # None: the run's prompts have no reflection
    labels: tuple[str, ...]  # the menu's labels, one per action
    menu: tuple[str, ...]  # the actions in the order the menu shows them
    probabilities: tuple[float, ...]  # the policy's, per menu entry
    action: int  # the menu entry taken
    reward: float


@dataclass(frozen=True)
class PlayedEpisode:
    stage: str
    start: str  # the listed start ("" where the env draws its own)
    instruction: str  # the task, as the prompt's header states it
    success: bool
    step_limit: bool  # ended at the step limit (neither a success nor a failure ended it)
    episode_return: float
    steps: tuple[PlayedStep, ...]


def play_episodes(
    policy: OptionPolicy,
    env: ReflectRLVectorEnv,
    episodes: int,
    greedy: bool,
    seed: int,
    starts: list[str] | None = None,
) -> list[PlayedEpisode]:
    """`episodes` episodes on a vector env of one slot (from `starts` in order, when given)."""
    import torch

    if env.num_envs != 1:
        raise ValueError(f"play steps one env slot, not {env.num_envs}")
    policy.eval()
    generator = torch.Generator().manual_seed(seed)
    if starts is not None:
        env.set_starts([list(starts[:episodes])])
    obs, _ = env.reset()
    env.pop_stats()
    played: list[PlayedEpisode] = []
    steps: list[PlayedStep] = []
    instruction = ""
    while len(played) < episodes:
        view = env.last_views[0]
        instruction = instruction or view.instruction
        with torch.no_grad():
            logits, _ = policy.logits_and_hidden({k: torch.as_tensor(v) for k, v in obs.items()})
        probabilities = logits[0, : len(view.menu)].float().softmax(-1)
        if greedy:
            action = int(probabilities.argmax())
        else:
            action = int(torch.multinomial(probabilities, 1, generator=generator))
        obs, rewards, terminated, truncated, _ = env.step(np.array([action]))
        steps.append(
            PlayedStep(
                observation=view.observation,
                reflection=view.reflection,
                labels=tuple(env.labels[: len(view.menu)]),
                menu=view.menu,
                probabilities=tuple(round(float(p), 6) for p in probabilities),
                action=action,
                reward=float(rewards[0]),
            )
        )
        if terminated[0] or truncated[0]:
            (record,) = env.pop_stats()["episodes"]
            played.append(
                PlayedEpisode(
                    stage=record["stage"],
                    start=record["start"],
                    instruction=instruction,
                    success=record["success"],
                    step_limit=record["step_limit"],
                    episode_return=record["episode_return"],
                    steps=tuple(steps),
                )
            )
            steps, instruction = [], ""
            if len(played) < episodes:
                obs, *_ = env.step(np.array([0]))  # autoreset: this step starts the next one
    return played


def outcome(episode: PlayedEpisode) -> str:
    if episode.success:
        return "success"
    return "step limit" if episode.step_limit else "failure"


def format_episode(number: int, total: int, episode: PlayedEpisode) -> str:
    start = f", start {episode.start}" if episode.start else ""
    lines = [
        f"episode {number}/{total}: stage {episode.stage}{start}: {outcome(episode)}, "
        f"return {episode.episode_return:+.2f}, {len(episode.steps)} steps",
        f"  task: {' '.join(episode.instruction.split())}",
    ]
    for k, step in enumerate(episode.steps, 1):
        lines.append(f"  step {k}")
        lines += [f"    | {line}" for line in step.observation.splitlines()]
        if step.reflection is not None:
            lines.append(f"    reflection: {' '.join(step.reflection.split())}")
        width = max(len(a) for a in step.menu)
        for i, (label, action) in enumerate(zip(step.labels, step.menu, strict=True)):
            mark = "->" if i == step.action else "  "
            lines.append(f"    {mark} {label}. {action:<{width}}  p={step.probabilities[i]:.3f}")
        taken = f"{step.labels[step.action]}. {step.menu[step.action]}"
        lines.append(f"    action {taken}, reward {step.reward:+.2f}")
    return "\n".join(lines)


def add_commands(sub: Any) -> None:
    pl = sub.add_parser(
        "play",
        help="watch a run's final players play held-out episodes, step by step",
        description="Play N held-out episodes (the starts `reflectrl eval` plays) with the run's "
        "final policy and its reflection server, and print every step: the observation, the "
        "reflection, the menu with the policy's probability of each action, the action taken "
        "and the reward. --html FILE also writes one self-contained page that steps through "
        "the episodes.",
    )
    pl.add_argument("run", metavar="RUN", help="a run directory (after its sft or rl stage)")
    pl.add_argument("--episodes", type=int, default=3, help="episodes to play (default 3)")
    pl.add_argument("--stage", help="curriculum stage (default: the last stage eval plays)")
    pl.add_argument(
        "--sampled", action="store_true", help="sample actions (default: greedy, the argmax)"
    )
    pl.add_argument("--split", help="the env split to play (eval.split; default: held out)")
    pl.add_argument("--seed", type=int, help="(eval.seed, else run.seed)")
    pl.add_argument("--html", metavar="FILE", help="also write the episodes as an HTML page")
    add_config_arguments(pl, "reflection.temperature=0.7", "YAML config (default: the run's)")
    pl.add_argument("--address", help="join this Ray cluster (default: $RAY_ADDRESS or local)")
    pl.set_defaults(handler=run_play)


def run_play(args: argparse.Namespace) -> int:
    from reflectrl.config import load_config
    from reflectrl.evaluation.held_out import eval_config, run_policy
    from reflectrl.run_dir import CONFIG_FILE

    run_dir = Path(args.run)
    if args.episodes < 1:
        raise ConfigError(f"--episodes {args.episodes}: need at least 1")
    html = Path(args.html) if args.html else None
    if html is not None and (html.is_dir() or not html.parent.is_dir()):
        raise ConfigError(f"--html {html}: need a file path in an existing folder")
    if not (run_dir / CONFIG_FILE).is_file():
        raise ConfigError(f"RUN {run_dir}: no {CONFIG_FILE} there; is it a run directory?")
    overrides = list(args.overrides)
    for key, value in (("split", args.split), ("seed", args.seed)):
        if value is not None:
            overrides.append(f"eval.{key}={value}")
    config = load_config(args.config or run_dir / CONFIG_FILE, overrides)
    config, source = run_policy(run_dir, config)
    config, stages = eval_config(config)
    stage = args.stage or stages[-1]
    if args.stage is not None:
        config.eval.stages = [stage]
        eval_config(config)  # an unknown stage: one line
    episodes = play_run(config, source, stage, args, run_dir)
    for number, episode in enumerate(episodes, 1):
        print(format_episode(number, len(episodes), episode), flush=True)
    wins = sum(e.success for e in episodes)
    print(f"played {len(episodes)} episodes of stage {stage}: {wins} successes")
    if html is not None:
        from reflectrl.atomic_files import write_text
        from reflectrl.evaluation.play_page import play_page

        title = f"{run_dir.name}: {config.env.name}, stage {stage}"
        write_text(html, play_page(title, [asdict(e) for e in episodes]))
        print(f"wrote {html}")
    return 0


def play_run(
    config: Any, source: Any, stage: str, args: argparse.Namespace, run_dir: Path
) -> list[PlayedEpisode]:
    """Start Ray and the reflection server the run's config serves, then play."""
    import ray

    from reflectrl.cluster.ray_init import init_ray
    from reflectrl.data.scratch import build_model, resolve_or_build
    from reflectrl.evaluation.held_out import held_out_starts
    from reflectrl.models.policy import build_policy
    from reflectrl.reflection.actor import ReflectionServers
    from reflectrl.reflection.endpoint import ReflectionEndpoint
    from reflectrl.rollout.env_creator import make_vector_env

    init_ray(args.address, config, 1)
    servers = ReflectionServers(build_model)
    try:
        endpoint = None
        if config.reflection.enabled:
            print("play: starting the reflection server", file=sys.stderr, flush=True)
            if config.reflection.server == "local":
                endpoint = servers.start(config.reflection, run_dir / "play_reflection_server.log")
            else:
                endpoint = ReflectionEndpoint.external(config.reflection)
        ctx = {
            "reflectrl": config.model_dump(mode="json"),
            "reflection": None if endpoint is None else endpoint.to_dict(),
            "num_envs": 1,
        }
        env = make_vector_env(ctx)
        env.set_worker_index(1)
        env.set_stage(stage)
        policy = build_policy(
            config.policy,
            resolve_or_build(config.policy.model),
            env.label_ids,
            config.run.seed,
            for_rollouts=True,
        )
        source.load_into(policy)
        starts = held_out_starts(config, stage)
        try:
            return play_episodes(
                policy, env, args.episodes, not args.sampled, config.run.seed, starts
            )
        finally:
            env.close()
    finally:
        servers.stop()
        ray.shutdown()
