"""DRF object permissions over `runs.access`, checked after visibility: a run the caller cannot
see is already a 404, so these only ever turn a visible run into a 403."""

from typing import Any

from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from runs import access


class CanCancel(BasePermission):
    message = "you may not cancel this run"

    def has_object_permission(self, request: Request, view: Any, obj: Any) -> bool:
        return access.can_cancel(request.user, obj)


class CanStop(BasePermission):
    message = "stopping a run needs the runs.stop_run permission"

    def has_object_permission(self, request: Request, view: Any, obj: Any) -> bool:
        return access.can_stop(request.user, obj)


class CanPauseResume(BasePermission):
    message = "you may not pause or resume this run"

    def has_object_permission(self, request: Request, view: Any, obj: Any) -> bool:
        return access.can_pause_resume(request.user, obj)


class CanRerun(BasePermission):
    message = "rerunning a run needs to own it or the runs.change_run permission"

    def has_object_permission(self, request: Request, view: Any, obj: Any) -> bool:
        return access.can_rerun(request.user, obj)
