"""Who may see a run and who may do what to it (docs/design/api.md#access), in the order of
docs/design/api.md#check-order: a run the caller cannot see is `NotFound` (404) before one they may
not command is `PermissionDenied` (403). The API and the services ask the same rules here."""

from collections.abc import Callable
from dataclasses import dataclass
from uuid import UUID

from django.contrib.auth.models import AbstractUser, AnonymousUser

from runs.exceptions import NotFound, PermissionDenied
from runs.models import Run

# The project's two user types: `User` is someone who acts (owns runs, sends commands); `AnyUser`
# may also be the anonymous user of a request, which sees nothing.
User = AbstractUser
AnyUser = AbstractUser | AnonymousUser


# Either sees every run: `runs.change_run` too, which Django's admin takes to include viewing.
SEES_EVERY_RUN = ("runs.view_run", "runs.change_run")


def sees_every_run(user: AnyUser) -> bool:
    """One rule for the console and the API alike (and, for many users at once, for the streams'
    re-check: `selectors.users_active`)."""
    return any(user.has_perm(perm) for perm in SEES_EVERY_RUN)


def can_see(user: AnyUser, run: Run) -> bool:
    """Their own runs; every run with `runs.view_run` or `runs.change_run` (`selectors.run_visible`
    for many runs). An owner needs no permission lookup."""
    return bool(user.is_authenticated) and (run.owner_id == user.pk or sees_every_run(user))


def _owns(user: AnyUser, run: Run) -> bool:
    return user.is_authenticated and user.pk == run.owner_id


def can_cancel(user: AnyUser, run: Run) -> bool:
    """Owners cancel their runs; `runs.cancel_run` cancels any visible run (as staff)."""
    return _owns(user, run) or user.has_perm("runs.cancel_run")


def can_stop(user: AnyUser, run: Run) -> bool:
    """Stop is the host's or staff's policy end: `runs.stop_run` only, even for the owner."""
    return user.has_perm("runs.stop_run")


def can_pause_resume(user: AnyUser, run: Run) -> bool:
    """Owners pause and resume their runs; `runs.change_run` may for any visible run."""
    return _owns(user, run) or user.has_perm("runs.change_run")


def can_see_ticket(user: AnyUser, run: Run) -> bool:
    """The resume ticket is shown to exactly those who may resume with it."""
    return can_pause_resume(user, run)


def can_rerun(user: AnyUser, run: Run) -> bool:
    """Owners rerun their runs; `runs.change_run` may rerun any visible run. Either way the caller
    owns the new run (docs/design/commands.md#rerun): seeing a run (`runs.view_run`) is not enough
    to spend someone's input on a run of one's own."""
    return _owns(user, run) or user.has_perm("runs.change_run")


@dataclass(frozen=True)
class Rule:
    """Who may send a command to a run they see, and the 403's message for the others."""

    allowed: Callable[[AnyUser, Run], bool]
    refusal: str


CANCEL = Rule(can_cancel, "you may not cancel this run")
STOP = Rule(can_stop, "stopping a run needs the runs.stop_run permission")
PAUSE_RESUME = Rule(can_pause_resume, "you may not pause or resume this run")
RERUN = Rule(can_rerun, "rerunning a run needs to own it or the runs.change_run permission")


def require(user: AnyUser, run: Run, rule: Rule, *, run_id: UUID | str) -> None:
    """Refuse `user` the command of `rule` on `run` (asked for as `run_id`): `NotFound` if they
    cannot see it, as for no such run; else `PermissionDenied` if the rule does not let them."""
    if not can_see(user, run):
        raise NotFound(f"run {run_id} not found")
    if not rule.allowed(user, run):
        raise PermissionDenied(rule.refusal)
