"""VLLMServer: the command and the log summary (unit), and a real vLLM server (integration)."""

from __future__ import annotations

import importlib.util
import os
import re
import socket
import sys
from pathlib import Path

import pytest

from reflectrl.data.scratch import resolve_or_build
from reflectrl.errors import ReflectionServerError
from reflectrl.reflection.client import ReflectionClient, quoted_commands_regex
from reflectrl.reflection.server import VLLMServer, child_pids, group_members, summarize_log
from reflectrl.reflection.vllm_cpu import FORKED

os.environ.setdefault("HF_HUB_OFFLINE", "1")

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm (vllm-cpu) is not installed"
)

ENGINE_FAILURE_LOG = """\
(APIServer pid=1) INFO 11-30 00:31:54 [api_utils.py:286] non-default args: {}
(EngineCore pid=2) ERROR 11-30 00:31:58 [core.py:900] EngineCore failed to start.
Traceback (most recent call last):
  File "core.py", line 10, in run
ValueError: To serve at least one request with max seq len (4096), 2.0 GiB KV cache is needed
Traceback (most recent call last):
  File "api_server.py", line 5, in <module>
RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
/usr/lib/python3.11/multiprocessing/resource_tracker.py:254: UserWarning: resource_tracker: leak
  warnings.warn('resource_tracker: There appear to be %d '
"""


def test_summary_keeps_root_cause_and_wrapper() -> None:
    summary = summarize_log(ENGINE_FAILURE_LOG)
    assert summary == (
        "ValueError: To serve at least one request with max seq len (4096), 2.0 GiB KV cache is "
        "needed | RuntimeError: Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {}"
    )


def test_summary_appends_indented_detail_and_falls_back_to_last_lines() -> None:
    pydantic = "x\npydantic_core.ValidationError: 1 validation error\n  Value error, bad model\n"
    assert summarize_log(pydantic) == "pydantic_core.ValidationError: 1 validation error " + (
        "Value error, bad model"
    )
    plain = "(APIServer pid=9) INFO 11-30 00:00:00 [a.py:1] one\n\ntwo\nthree\nfour\n"
    assert summarize_log(plain) == "two | three | four"
    assert summarize_log("") == "(log is empty)"
    assert "\n" not in summarize_log("ValueError: " + "x" * 1000)


def test_command_is_an_argument_list_per_device(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    cpu = VLLMServer("/m dir", tmp_path / "log", served_model_name="r", port=1234)
    args = cpu.command()
    assert args[1:3] == ["-m", "reflectrl.reflection.vllm_cpu"]  # engine core forked
    assert args[args.index("--model") + 1] == "/m dir"  # one argument, no shell quoting
    for flag in ("--enforce-eager", "--dtype", "--block-size"):
        assert flag in args
    assert cpu.environment()["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert cpu.environment()["HF_HUB_OFFLINE"] == "1"
    assert cpu.url == "http://127.0.0.1:1234/v1"

    gpu = VLLMServer("/m", tmp_path / "log", device="cuda", extra_args=["--enable-lora"])
    assert gpu.command()[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert "--enforce-eager" not in gpu.command() and "--block-size" not in gpu.command()
    assert gpu.command()[-1] == "--enable-lora"
    assert "VLLM_CPU_KVCACHE_SPACE" not in gpu.environment()
    with pytest.raises(ValueError, match="device"):
        VLLMServer("/m", tmp_path / "log", device="tpu")  # type: ignore[arg-type]


def test_start_with_a_missing_python_fails_cleanly(tmp_path: Path) -> None:
    server = VLLMServer("/m", tmp_path / "log", python=str(tmp_path / "no-python"))
    with pytest.raises(ReflectionServerError, match="cannot start vLLM"):
        server.start()
    assert not server.is_running()


def test_wait_ready_reports_early_death_with_log_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A stand-in "server" that writes a traceback and dies: the error must quote it.
    script = tmp_path / "fake_vllm.py"
    script.write_text("import sys\nprint('ValueError: no such model', flush=True)\nsys.exit(3)\n")
    server = VLLMServer("/m", tmp_path / "log")
    monkeypatch.setattr(server, "command", lambda: [sys.executable, str(script)])
    server.start()
    with pytest.raises(ReflectionServerError) as info:
        server.wait_ready(timeout_s=30)
    message = str(info.value)
    assert "exited with code 3" in message and "ValueError: no such model" in message
    assert "\n" not in message and not server.is_running()


@pytest.fixture(scope="module")
def scratch_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return resolve_or_build("scratch:dangerous_taxi", tmp_path_factory.mktemp("cache"))


@pytest.mark.integration
@needs_vllm
def test_real_server_reflects_in_one_request_and_stops_cleanly(
    scratch_model: Path, tmp_path: Path
) -> None:
    """On the CPU recipe's model (`scratch:<env>`, a 512-id tokenizer trained on Taxi text;
    the SmolLM2-tokenizer `tiny` is served in the pipeline tests)."""
    import httpx

    from reflectrl.models.loading import load_tokenizer

    server = VLLMServer(scratch_model, tmp_path / "server.log", served_model_name="tiny")
    with server:
        client = ReflectionClient(server.url, "tiny", max_tokens=8)
        assert client.health()
        prompts = [f"Step {i}: the taxi is at row {i}. # Analyze:\n" for i in range(4)]
        # The server reads prompts with the model's own tokenizer.
        body = {"model": "tiny", "prompt": prompts[0], "max_tokens": 1}
        usage = httpx.post(f"{server.url}/completions", json=body, timeout=120).json()["usage"]
        tokenizer = load_tokenizer(scratch_model)
        assert usage["prompt_tokens"] == len(tokenizer.encode(prompts[0])) < len(prompts[0])
        out = client.reflect(prompts)
        assert len(out) == 4 and all(isinstance(text, str) for text in out)
        assert client.calls == 4 and client.requests == 1
        log = server.log_path.read_text()
        assert log.count('"POST /v1/completions HTTP/1.1" 200') == 2
        # Greedy decoding: one request per prompt gives the same texts, in the same order.
        alone = ReflectionClient(server.url, "tiny", max_tokens=8, mode="concurrent")
        assert alone.reflect(prompts) == out and alone.requests == 4
        # reflection.quote_valid_actions: the server decodes under our regex (its dialect takes
        # our escapes), and a regex that demands a quote gets one of the commands.
        commands = ["go north", "cd ..", "cat my-file_1.py"]
        quoting = ReflectionClient(server.url, "tiny", max_tokens=12)
        texts = quoting.reflect(prompts, [commands] * 4)
        assert quoting.requests == 4
        assert all(re.fullmatch(quoted_commands_regex(commands), text) for text in texts)
        demand = r'"(go north|cd \.\.|cat my\-file_1\.py)"'
        body = {"model": "tiny", "prompt": prompts[0], "max_tokens": 40, "temperature": 0,
                "structured_outputs": {"regex": demand}}  # fmt: skip
        answer = httpx.post(f"{server.url}/completions", json=body, timeout=120).json()
        assert answer["choices"][0]["text"] in [f'"{c}"' for c in commands], answer

        assert server.process is not None
        pgid, port = server.process.pid, server.port
        # The guard, the API server and its engine core, forked (a spawned one would not run
        # the API server's fork handler, which logs the pid).
        (api_server,) = child_pids(pgid)
        (engine_core,) = child_pids(api_server)
        assert {api_server, engine_core} <= set(group_members(pgid))
        assert f"{FORKED} {engine_core}\n" in server.log_path.read_text()
    assert group_members(pgid) == []
    assert not server.is_running()
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", port)) != 0


@pytest.mark.integration
@needs_vllm
def test_bad_model_dir_fails_with_log_line(tmp_path: Path) -> None:
    bad = tmp_path / "bad-model"
    bad.mkdir()
    (bad / "config.json").write_text('{"model_type": "no_such_architecture"}')
    server = VLLMServer(bad, tmp_path / "bad.log", served_model_name="bad")
    with pytest.raises(ReflectionServerError) as info, server:
        pass
    message = str(info.value)
    assert "exited with code" in message  # died and was noticed, not a timeout
    assert "no_such_architecture" in message and str(tmp_path / "bad.log") in message
    assert "\n" not in message
    assert server.process is None


def test_gpu_recipe_serves_in_bf16_within_its_memory_share(tmp_path: Path) -> None:
    """The command a replica of configs/gpu.yaml runs (built by the replica actor's own
    function, not started): the CUDA build's flags and the SFT adapter's LoRA flags."""
    from reflectrl.config import load_config
    from reflectrl.models.policy import lora_config
    from reflectrl.reflection.actor import vllm_server

    adapter = tmp_path / "reflection"
    lora_config(16, 32, ["q_proj", "v_proj"]).save_pretrained(str(adapter))
    repo = Path(__file__).resolve().parents[1]
    overrides = ["reflection.model=tiny", f"reflection.adapter={adapter}"]
    config = load_config(repo / "configs" / "gpu.yaml", overrides).reflection
    args = vllm_server(config, tmp_path / "log", api_key=None).command()
    assert args[args.index("--dtype") + 1] == "bfloat16"
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.25"
    assert "--enforce-eager" not in args and "--block-size" not in args
    assert args[args.index("--max-lora-rank") + 1] == "16"
    assert "--enable-lora" in args
    assert args[args.index("--lora-modules") + 1] == f"reflection-sft={adapter}"
    # The CPU recipe keeps vllm-cpu's flags.
    cpu = load_config(repo / "configs" / "cpu.yaml", ["reflection.model=tiny"]).reflection
    cpu_args = vllm_server(cpu, tmp_path / "log", api_key=None).command()
    assert cpu_args[cpu_args.index("--dtype") + 1] == "float32" and "--enforce-eager" in cpu_args
    assert "--gpu-memory-utilization" not in cpu_args


def test_a_replica_counts_restarts_within_its_launch_only(tmp_path: Path) -> None:
    """The pgid file a replica leaves names its launch: a restart by Ray in the same launch
    counts, a server left by an earlier launch of the run (then --resume) is killed but is no
    restart of this one."""
    import subprocess

    from reflectrl.reflection.actor import _record_start, _write_pgid

    pgid_file = tmp_path / "reflection_server.pgid"
    assert _record_start(pgid_file, "launch-a") == 1  # no file yet
    _write_pgid(pgid_file, None, 1, "launch-a")
    assert _record_start(pgid_file, "launch-a") == 2  # Ray restarted the replica
    _write_pgid(pgid_file, None, 2, "launch-a")
    assert _record_start(pgid_file, "launch-b") == 1  # a resume: a new launch
    # The earlier launch's server (its own process group) is killed either way.
    orphan = subprocess.Popen(["sleep", "60"], start_new_session=True)
    _write_pgid(pgid_file, orphan.pid, 3, "launch-a")
    assert _record_start(pgid_file, "launch-b") == 1
    assert orphan.wait(timeout=10) == -9
