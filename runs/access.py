"""Who may do what to a run they can see (docs/design/api.md#access).

Visibility itself is `selectors.run_visible`: a run the caller cannot see is a 404 before any of
these is asked, so they only ever turn a visible run into a 403.
"""

from django.contrib.auth.models import AbstractUser, AnonymousUser

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
