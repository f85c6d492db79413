"""The command interpreter: `cd <dir>`, `cd ..`, `cat <file>`, `id <file>` over a `View`.

`Shell.run_command(text)` is the one entry point for typed commands (the expert, tests, the
interactive shell, agents that type). Every command names ONE entry of the current listing
(no paths): anything else is an error observation, never an exception. Error messages never
repeat what was typed, so an output cannot echo a path or text from outside the root.

`View` is what an episode may see of a sandbox: entries dropped for the episode (training's
`drop_prob`, a lazy per-path test, not a copy) are absent, and each listing is cut to fit the
action menu: entries in sorted order (directories first), directories costing one menu slot
and files two (`cat`, `id`), are kept while they fit `max_actions - 1` slots (one is kept for
`cd ..`). The cut depends only on the listing, never on the task, so it is stable; entries
past it are unreachable (the task generator skips targets there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from reflectrl.envs.auto_explore.render import render_file
from reflectrl.envs.auto_explore.sandbox import Entry, Sandbox, valid_name

RelPath = tuple[str, ...]
Status = Literal["ok", "warning", "error"]
MAX_COMMAND_CHARS = 300
DEFAULT_MAX_ACTIONS = 40
DEFAULT_MAX_OUTPUT_CHARS = 800
USAGE = "use one of: cd <dir>, cd .., cat <file>, id <file> (names from the listing)"


@dataclass(frozen=True)
class Listing:
    entries: tuple[Entry, ...]  # what the episode sees and can act on
    omitted: int  # visible entries left out because the menu is full


def cap_entries(entries: tuple[Entry, ...], max_actions: int) -> tuple[tuple[Entry, ...], int]:
    """The longest prefix of `entries` whose menu fits (dirs 1 slot, files 2, 1 for `cd ..`)."""
    budget, used, kept = max_actions - 1, 0, 0
    for entry in entries:
        cost = 1 if entry.is_dir else 2
        if used + cost > budget:
            break
        used += cost
        kept += 1
    return entries[:kept], len(entries) - kept


class View:
    def __init__(
        self,
        sandbox: Sandbox,
        max_actions: int,
        keep: Callable[[RelPath], bool] | None = None,
    ) -> None:
        if max_actions < 3:
            raise ValueError(f"max_actions must be >= 3 (got {max_actions})")
        self.sandbox = sandbox
        self.max_actions = max_actions
        self.keep = keep  # None: everything visible (evaluation, drop_prob 0)
        self._memo: dict[RelPath, Listing | None] = {}

    def listing(self, parts: RelPath) -> Listing | None:
        if parts in self._memo:
            return self._memo[parts]
        entries = self.sandbox.listing(parts)
        result = None
        if entries is not None:
            if self.keep is not None:
                entries = tuple(e for e in entries if self.keep((*parts, e.name)))
            result = Listing(*cap_entries(entries, self.max_actions))
        if self.sandbox.cache:  # a sandbox that re-reads the disk gets a view that does too
            self._memo[parts] = result
        return result

    def entry(self, parts: RelPath, name: str) -> Entry | None:
        listing = self.listing(parts)
        if listing is None:
            return None
        return next((e for e in listing.entries if e.name == name), None)

    def reachable(self, parts: RelPath, is_dir: bool = False) -> bool:
        """Whether the entry at `parts` can be reached from the root through listings."""
        for depth in range(len(parts)):
            found = self.entry(parts[:depth], parts[depth])
            last = depth == len(parts) - 1
            if found is None or found.is_dir != (is_dir if last else True):
                return False
        return True


@dataclass(frozen=True)
class CommandResult:
    output: str
    status: Status = "ok"
    identified: RelPath | None = None  # the file named by `id`


def path_text(parts: RelPath) -> str:
    return "/".join(parts) if parts else "."


class Shell:
    """One exploration: current directory, history, files read. Starts at the root."""

    def __init__(self, view: View, *, max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS) -> None:
        self.view = view
        self.max_output_chars = max_output_chars
        self.cwd: RelPath = ()
        self.history: list[str] = []  # commands as run; invalid ones as "<invalid command>"
        self.read: set[RelPath] = set()
        self.visited: set[RelPath] = {()}
        self.last: CommandResult | None = None

    def run_command(self, text: str) -> str:
        return self.execute(text).output

    def execute(self, text: str) -> CommandResult:
        result, canonical = self._execute(text)
        self.history.append(canonical if canonical is not None else "<invalid command>")
        self.last = result
        return result

    def listing(self) -> Listing:
        listing = self.view.listing(self.cwd)
        return listing if listing is not None else Listing((), 0)

    def menu(self) -> tuple[str, ...]:
        """The valid commands now: `cd ..`, `cd <dir>`, `cat <unread file>`, `id <file>`."""
        entries = self.listing().entries
        files = [e.name for e in entries if not e.is_dir]
        return (
            *(["cd .."] if self.cwd else []),
            *(f"cd {e.name}" for e in entries if e.is_dir),
            *(f"cat {f}" for f in files if (*self.cwd, f) not in self.read),
            *(f"id {f}" for f in files),
        )

    def listing_text(self) -> str:
        listing = self.listing()
        lines = [e.name + ("/" if e.is_dir else "") for e in listing.entries]
        if listing.omitted:
            lines.append(f"({listing.omitted} more entries not shown)")
        return "\n".join(lines) if lines else "(empty)"

    # --- internals ------------------------------------------------------------------------

    def _execute(self, text: str) -> tuple[CommandResult, str | None]:
        if not isinstance(text, str) or len(text) > MAX_COMMAND_CHARS:
            return _error("command too long or not text; " + USAGE), None
        # Rejects newlines, tabs, NUL and other control characters, and lone surrogates
        # (how non-UTF-8 input bytes arrive with surrogateescape).
        if not text.isprintable():
            return _error("command has unprintable characters; " + USAGE), None
        words = text.split()
        if len(words) != 2 or words[0] not in ("cd", "cat", "id"):
            return _error("unknown command; " + USAGE), None
        verb, arg = words
        if verb == "cd" and arg == "..":
            if not self.cwd:
                return _error("cd ..: already at the repository root"), "cd .."
            self.cwd = self.cwd[:-1]
            return CommandResult(f"Changed directory to {path_text(self.cwd)}."), "cd .."
        # One name of the current listing: no `/`, no `..`, no hidden, dropped or cut entry.
        entry = self.view.entry(self.cwd, arg) if valid_name(arg) else None
        if entry is None:
            return _error(f"{verb}: no such entry in this directory; {USAGE}"), None
        canonical = f"{verb} {entry.name}"
        path = (*self.cwd, entry.name)
        if verb == "cd":
            if not entry.is_dir:
                return _error(f"cd: {entry.name} is a file, not a directory"), canonical
            self.cwd = path
            output = f"Changed directory to {path_text(path)}."
            if path in self.visited:  # walking in circles
                return CommandResult(output + " Warning: you were here before.", "warning"), (
                    canonical
                )
            self.visited.add(path)
            return CommandResult(output), canonical
        if entry.is_dir:
            return _error(f"{verb}: {entry.name} is a directory, not a file"), canonical
        if verb == "id":
            return CommandResult(f"You identified {path_text(path)}.", identified=path), canonical
        content = self.view.sandbox.read(path)
        if content.text is None:  # binary, unreadable, or no longer a regular file
            return _error(f"cat: cannot show {entry.name}: {content.error}"), canonical
        again = path in self.read
        prefix = "Warning: read before.\n" if again else ""
        rendered = render_file(entry.name, content, max(self.max_output_chars - len(prefix), 1))
        if again:
            return CommandResult(prefix + rendered.text, "warning"), canonical
        self.read.add(path)
        return CommandResult(rendered.text), canonical


def _error(message: str) -> CommandResult:
    return CommandResult(f"error: {message}", "error")
