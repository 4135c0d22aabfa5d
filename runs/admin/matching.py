"""The run list's "Cancel all that match" and "Stop all that match" (docs/design/commands.md#bulk-commands):
the command on every run the list's current filters and search select, however many pages they
take, after a confirmation page that shows how many. The page posts that count back as the most
to command: if more match by then (new runs arrived), nothing is done.

The same staff commands as the list's actions (`runs.admin.commands`): one locked transaction per
run, each reported.
"""

from typing import Any

from django.contrib.admin.options import IncorrectLookupParameters
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import URLPattern, path, reverse

from runs.admin.commands import COMMANDS, CommandsMixin

# The list's query parameters that are not filters: its page, and the admin's popup markers.
_NOT_FILTERS = ("p", "_popup", "_to_field")


class MatchingMixin(CommandsMixin):
    def matching_urls(self) -> list[URLPattern]:
        info = self.opts.app_label, self.opts.model_name
        return [
            path(
                f"{command.name}-matching/",
                self.admin_site.admin_view(self.matching_view),  # login, staff, CSRF, never cached
                {"command": command.name},
                name=f"{info[0]}_{info[1]}_{command.name}_matching",
            )
            for command in COMMANDS
        ]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        query = request.GET.copy()
        for name in _NOT_FILTERS:
            query.pop(name, None)
        info = self.opts.app_label, self.opts.model_name
        buttons = [
            {
                "label": f"{command.name.capitalize()} all that match",
                "url": reverse(f"admin:{info[0]}_{info[1]}_{command.name}_matching") + f"?{query.urlencode()}",
            }
            for command in COMMANDS
            if command.allowed(request.user)
        ]
        return super().changelist_view(request, {**(extra_context or {}), "match_commands": buttons})

    def matching_view(self, request: HttpRequest, command: str) -> HttpResponse:
        chosen = next(c for c in COMMANDS if c.name == command)
        back_url = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist")
        back_url += f"?{request.GET.urlencode()}" if request.GET else ""
        try:
            # The list's own reading of its query: its filters, its search, its visibility.
            runs = self.get_changelist_instance(request).queryset
        except IncorrectLookupParameters:
            return HttpResponseRedirect(back_url)
        answer = self.bulk_command(request, runs, chosen, matching=True, back_url=back_url)
        # None: done (or refused), and reported: back to the list as it was.
        return HttpResponseRedirect(back_url) if answer is None else answer
