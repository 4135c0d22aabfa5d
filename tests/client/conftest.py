from collections.abc import Iterator

import pytest
from django.contrib.auth.models import User

import runledger_client as rl
from tests.support.db import token_for
from tests.support.live import FAST
from tests.support.proxies import CuttableProxy


@pytest.fixture
def client(proxy: CuttableProxy, alice: User) -> Iterator[rl.Client]:
    """The Python client as alice, through the test's CuttableProxy (here `client` is not Django's test client)."""
    with rl.Client(proxy.url, token_for(alice), retry=FAST) as made:
        yield made
