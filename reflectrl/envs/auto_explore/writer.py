"""Optional: rephrase the templated questions in natural language with any OpenAI-compatible
endpoint (off by default; the templates are the reproducible baseline).

A rephrased question is kept only if it is one line and still names the key verbatim, so it
still identifies exactly one file; otherwise the template stays.
"""

from __future__ import annotations

from collections.abc import Sequence

from reflectrl.envs.auto_explore.tasks import Task
from reflectrl.reflection.client import ReflectionClient

PROMPT = (
    "Rewrite this question about a code repository as a developer would ask it. "
    "Keep {quoted} exactly as written. Answer with the question only.\n"
    "Question: {question}\nRewritten question:"
)


def rewrite_questions(
    tasks: Sequence[Task],
    url: str,
    model: str,
    *,
    batch_size: int = 16,
    timeout_s: float = 60.0,
) -> list[Task]:
    prompts = [PROMPT.format(quoted=_quoted(t), question=t.question) for t in tasks]
    answers: list[str] = []
    with ReflectionClient(
        url, model, max_tokens=64, temperature=0.0, stop=("\n",), timeout_s=timeout_s
    ) as client:
        for start in range(0, len(prompts), batch_size):
            answers.extend(client.reflect(prompts[start : start + batch_size]))
    out: list[Task] = []
    for task, answer in zip(tasks, answers, strict=True):
        text = " ".join(answer.split())
        if text and text.isprintable() and task.key in text and len(text) <= 300:
            task = task.model_copy(update={"question": text})
        out.append(task)
    return out


def _quoted(task: Task) -> str:
    return f'"{task.key}"' if task.kind == "heading" else f"`{task.key}`"
