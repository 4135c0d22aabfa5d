"""A host project's URLconf by its dotted path, for processes (`ROOT_URLCONF` in CODE_SETTINGS,
tests/support/code_settings.py): the app under `PREFIX`, beside the host's own URLs."""

from tests.support.urls import host_patterns

PREFIX = "tools/agents/"

urlpatterns = host_patterns(PREFIX)
