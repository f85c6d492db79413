"""Bad input: one line naming the problem and the fix, exit code 2, no traceback, nothing lost."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import run_cli

REPO = Path(__file__).resolve().parents[1]
SMOKE = str(REPO / "configs" / "smoke.yaml")


def reflectrl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, timeout=timeout)


def assert_usage_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert "Traceback" not in result.stderr
    assert lines and lines[-1].startswith("reflectrl: error: "), result.stderr[-2000:]
    assert len([ln for ln in lines if ln.startswith("reflectrl: error")]) == 1
    for needle in needles:
        assert needle in lines[-1]


def test_help_lists_the_launch_options() -> None:
    result = reflectrl("launch", "--help")
    assert result.returncode == 0
    for flag in (
        "--workers",
        "--config",
        "--output",
        "--iterations",
        "--set",
        "--address",
        "--resume",
    ):
        assert flag in result.stdout


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (["--config", "/nonexistent/c.yaml"], ["/nonexistent/c.yaml", "does not exist"]),
        (["--config", SMOKE, "--set", "ppo.bogus=1"], ["ppo.bogus: unknown key"]),
        (["--config", SMOKE, "--set", "ppo.lr=fast"], ["ppo.lr", "'fast'"]),
        (["--config", SMOKE, "--workers", "0"], ["--workers 0"]),
        (["--config", SMOKE, "--set", "policy.model=/nonexistent/model"], ["/nonexistent/model"]),
        (
            [
                "--config",
                SMOKE,
                "--set",
                "reflection.server=url",
                "--set",
                "reflection.url=http://127.0.0.1:9/v1",
            ],
            ["reflection.url http://127.0.0.1:9/v1 does not answer"],
        ),
        (["--config", SMOKE, "--resume", "/nonexistent/run"], ["no config.yaml"]),
        (
            ["--config", SMOKE, "--set", "ppo.max_staleness=-1"],
            ["ppo.max_staleness", "greater than or equal to 0"],
        ),
        (
            ["--config", SMOKE, "--set", "ppo.max_staleness=2"],
            ["ppo.max_staleness", "less than or equal to 1"],
        ),
        (
            ["--config", SMOKE, "--set", "curriculum.stages=[{name: drop, max_iterations: 5}]"],
            ["curriculum.stages", "unknown stage 'drop'", "pickup, dropoff, full"],
        ),
        (
            ["--config", SMOKE, "--set", "data.episodes=0"],
            ["data.episodes", "greater than or equal to 1"],
        ),
        (
            ["--config", SMOKE, "--set", "env.options.starts=[0]"],
            ["env.options.starts", "0 is not a start state", "'train' split"],
        ),
        (
            ["--config", SMOKE, "--workers", "3", "--set", "ppo.train_batch_size=64"],
            ["ppo.train_batch_size=64", "3 workers", "ppo.rollout_fragment_length=16 = 96"],
        ),
        (
            ["--config", SMOKE, "--set", "reflection.max_tokens=100000"],
            ["reflection.max_tokens=100000", "reflection.max_model_len=512", "lower max_tokens"],
        ),
        (["--config", "NOT_UTF8"], ["is not UTF-8 text", "save the config as UTF-8"]),
        (
            ["--config", SMOKE, "--set", "rl.bootstrap_step_limit=true"],
            ["rl.bootstrap_step_limit=true", "rl.advantage=gae", "rl.advantage=state_table"],
        ),
        (["--config", SMOKE, "--set", "policy.action_head=tokens"], ["policy.action_head"]),
        (
            ["--config", SMOKE, "--set", "policy.text_normalisation=chars"],
            ["policy.text_normalisation", "'token', 'word' or 'none'"],
        ),
        (
            ["--config", SMOKE, "--set", "policy.show_menu=false"],
            ["show_menu=false needs action_head=text"],
        ),
        (
            ["--config", SMOKE, "--set", "policy.action_max_tokens=1"],
            ["policy.action_max_tokens", "greater than or equal to 2"],
        ),
        (
            ["--config", SMOKE, "--set", "sft.reflection_command_weight=0"],
            ["sft.reflection_command_weight", "greater than 0"],
        ),
        (
            ["--config", SMOKE, "--set", "run.trackers=[tensorboard, mlflo]"],
            ["run.trackers.1", "'tensorboard', 'mlflow' or 'wandb'", "'mlflo'"],
        ),
    ],
)
def test_bad_input_before_anything_starts(
    args: list[str], needles: list[str], tmp_path: Path
) -> None:
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("run:\n  seed: 1  # d\u00e9j\u00e0\n".encode("latin-1"))
    args = [str(latin1) if a == "NOT_UTF8" else a for a in args]
    output = tmp_path / "run"
    if "--resume" not in args:
        args += ["--output", str(output)]
    assert_usage_error(reflectrl("launch", *args), *needles)
    assert not output.exists()  # a failed start leaves no run directory


def test_text_head_with_a_tokenizer_without_eos_is_refused(tiny_dir: Path, tmp_path: Path) -> None:
    """The text head ends every action with EOS: a model whose tokenizer has none cannot
    render an action's end, so the run is refused before it starts."""
    from transformers import AutoTokenizer

    model = tmp_path / "no-eos"
    shutil.copytree(tiny_dir, model)
    tokenizer = AutoTokenizer.from_pretrained(model)
    tokenizer.eos_token = None
    tokenizer.save_pretrained(model)
    assert AutoTokenizer.from_pretrained(model).eos_token_id is None
    output = tmp_path / "run"
    args = ["--config", SMOKE, "--output", str(output), "--set", f"policy.model={model}"]
    result = reflectrl("launch", *args, "--set", "policy.action_head=text")
    assert_usage_error(result, "policy.action_head=text", "no EOS", "policy.action_head=label")
    assert not output.exists()


def test_output_with_an_earlier_run_is_refused_and_kept(tmp_path: Path) -> None:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"iteration": 1}\n')
    (run / "config.yaml").write_text("precious: true\n")
    result = reflectrl("launch", "--config", SMOKE, "--output", str(run))
    assert_usage_error(result, "--resume")
    assert (run / "metrics.jsonl").read_text() == '{"iteration": 1}\n'
    assert (run / "config.yaml").read_text() == "precious: true\n"


# What makes a start take seconds: none of it loads before bad input is refused.
HEAVY = ("torch", "ray", "transformers", "peft", "vllm")
PROBE = (
    "import sys; from reflectrl.cli import main; code = main(sys.argv[1:]); "
    f"print([m for m in {HEAVY!r} if m in sys.modules]); sys.exit(code)"
)


@pytest.mark.parametrize(
    "args",
    [
        ["launch", "--config", SMOKE, "--set", "ppo.bogus=1"],
        ["launch", "--config", SMOKE, "--resume", "/nonexistent/run"],
        ["launch", "--config", SMOKE, "--output", "EARLIER_RUN"],
        ["eval", "--config", SMOKE, "--run", "UNFINISHED_RUN"],
        ["eval", "--config", SMOKE, "--adapter", "NOT_AN_ADAPTER"],
        ["eval", "--config", SMOKE, "--adapter", "NOT_AN_ADAPTER", "--split", "valid_unseen"],
        ["play", "UNFINISHED_RUN"],
        ["data", "--config", SMOKE, "--set", "data.episodes=0", "--out", "NOT_AN_ADAPTER"],
    ],
)
def test_bad_input_is_refused_before_the_model_libraries_load(
    args: list[str], tmp_path: Path
) -> None:
    """A typo costs a fraction of a second, not the seconds torch, Ray and peft take to load."""
    unfinished = tmp_path / "unfinished"
    unfinished.mkdir()
    shutil.copy(SMOKE, unfinished / "config.yaml")  # a run that never finished a stage
    where = {"EARLIER_RUN": unfinished, "UNFINISHED_RUN": unfinished, "NOT_AN_ADAPTER": tmp_path}
    args = [str(where.get(a, a)) for a in args]
    result = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, cwd=REPO
    )
    assert_usage_error(result)
    assert result.stdout.strip() == "[]", result.stdout


@pytest.mark.integration
def test_unreachable_ray_address(tmp_path: Path) -> None:
    result = reflectrl(
        "launch", "--config", SMOKE, "--address", "127.0.0.1:9", "--output", str(tmp_path / "r")
    )
    assert_usage_error(result, "cannot reach Ray at '127.0.0.1:9'")


@pytest.mark.integration
def test_reflection_server_that_fails_to_start_shows_its_log(
    tmp_path: Path, tiny_dir: Path
) -> None:
    import shutil

    broken = tmp_path / "broken-model"
    shutil.copytree(tiny_dir, broken)
    (broken / "model.safetensors").write_bytes(b"not a safetensors file")
    result = reflectrl(
        "launch",
        "--config",
        SMOKE,
        "--output",
        str(tmp_path / "run"),
        "--set",
        f"reflection.model={broken}",
        "--set",
        "sft.enabled=false",  # straight to RL, whose first act is to start the server
        timeout=600,
    )
    assert_usage_error(result, "reflection")
    assert (tmp_path / "run" / "reflection_server.log").is_file()
    # With SFT on, the same model fails in the SFT stage's Ray task: still one line.
    result = reflectrl(
        "launch", "--config", SMOKE, "--output", str(tmp_path / "run2"),
        "--set", f"reflection.model={broken}", timeout=600,
    )  # fmt: skip
    assert_usage_error(result, f"cannot load model from {broken}")
    assert (tmp_path / "run2" / "stages" / "data.json").is_file()  # the data stage is kept


def test_without_config_the_machine_picks_its_recipe_and_says_so() -> None:
    """No CUDA here: the CPU recipe, named on the first line (the run itself stops at the bad
    --workers, before anything starts)."""
    import torch

    result = reflectrl("launch", "--workers", "0")
    recipe = "gpu.yaml" if torch.cuda.is_available() else "cpu.yaml"
    first = result.stdout.splitlines()[0]
    assert first.endswith(f"using the recipe {REPO / 'configs' / recipe} (pass --config FILE "
                          "to choose another)")  # fmt: skip
    assert_usage_error(result, "--workers 0")
