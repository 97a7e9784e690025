"""The errors of a run: :class:`RunError`, raised when a plugin misbehaves or the data does
not fit the spec, with a message that says which and where, and :class:`MethodsFailed`, raised
once the methods that could finish have finished and their leaderboard is written (each failed
method a :class:`MethodFailure`). Its own module so that every step of the run (guards, cells,
extraction, jobs) and the executors raise and catch them without importing one another."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["MethodFailure", "MethodsFailed", "RunError"]


class RunError(RuntimeError):
    """A plugin misbehaved or data does not fit the spec; the message says which and where."""


@dataclass(frozen=True)
class MethodFailure:
    """One method of one experiment whose cells could not all be computed: the seeds it was
    working on and the error (which names the plugin, the seeds and the parameters)."""

    experiment: str
    method: str
    seeds: tuple[int, ...]
    error: str
    #: the exception it failed with (chained to the run's error, for ``--debug``)
    cause: BaseException | None = field(default=None, compare=False, repr=False)

    def entry(self) -> dict:
        """The failed row as the leaderboard takes it (JSON-ready)."""
        return {"experiment": self.experiment, "method": self.method,
                "seeds": list(dict.fromkeys(self.seeds)), "error": self.error}


def leaderboard_note(path, n_failed: int) -> str:
    """The words saying where the leaderboard of the finished methods is."""
    return (f"the leaderboard of the methods that finished is written to {path} with the "
            f"failed {'row' if n_failed == 1 else 'rows'} marked")


class MethodsFailed(RunError):
    """Some methods failed in this process's run; the others' cells and leaderboard are
    written (``leaderboard``: the Markdown file, or None when none could be written)."""

    def __init__(self, failures: list[MethodFailure], total: int, leaderboard=None):
        self.failures = failures
        self.leaderboard = leaderboard
        them = "it" if len(failures) == 1 else "them"
        note = (f"{leaderboard_note(leaderboard, len(failures))}; " if leaderboard is not None
                else "the cells that finished are saved; ")
        note += f"rerun the same command to retry {them}"
        if len(failures) == 1:
            text = f"{failures[0].error}\n  ({note})"
        else:
            text = f"{len(failures)} of {total} methods failed; {note}:"
            text += "".join(f"\n  - {f.error}" for f in failures)
        super().__init__(text)
