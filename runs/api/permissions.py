"""DRF object permissions over `runs.access`, checked after visibility: a run the caller cannot
see is already a 404, so these only ever turn a visible run into a 403."""

from collections.abc import Callable
from typing import Any

from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from runs import access
from runs.models import Run


def _object_permission(name: str, allowed: Callable[[access.AnyUser, Run], bool], refusal: str) -> type[BasePermission]:
    """The permission class that lets `allowed` users act on a run and refuses others with `refusal`."""

    def has_object_permission(self: BasePermission, request: Request, view: Any, obj: Any) -> bool:
        return allowed(request.user, obj)

    return type(name, (BasePermission,), {"message": refusal, "has_object_permission": has_object_permission})


CanCancel = _object_permission("CanCancel", access.can_cancel, "you may not cancel this run")
CanStop = _object_permission("CanStop", access.can_stop, "stopping a run needs the runs.stop_run permission")
CanPauseResume = _object_permission("CanPauseResume", access.can_pause_resume, "you may not pause or resume this run")
CanRerun = _object_permission(
    "CanRerun", access.can_rerun, "rerunning a run needs to own it or the runs.change_run permission"
)
