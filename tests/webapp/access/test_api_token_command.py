"""`manage.py api_token create` for a user who does not exist yet says how to make one."""

from __future__ import annotations

import pytest
from django.core.management import CommandError, call_command

from webapp.access.models import ApiToken


@pytest.mark.django_db
def test_a_token_for_an_unknown_user_is_refused_with_the_command_that_makes_the_user():
    with pytest.raises(CommandError) as refused:
        call_command("api_token", "create", "alice", "--name", "gpu-7", "--role", "trainer")

    message = str(refused.value)
    assert "no user named 'alice'" in message
    assert "manage.py createsuperuser --username alice" in message and "role group" in message
    assert not ApiToken.objects.exists()
