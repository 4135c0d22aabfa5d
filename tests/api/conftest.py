import pytest
from django.contrib.auth.models import User
from rest_framework.test import APIClient

from tests.support.api import client_for


@pytest.fixture
def api(alice: User) -> APIClient:
    """An API client with a token of alice's."""
    return client_for(alice)
