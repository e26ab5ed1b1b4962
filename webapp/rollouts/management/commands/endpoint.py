"""`manage.py endpoint add|list`: register model endpoints and see them (an admin's or ops' command).

    manage.py endpoint add openai --url https://api.openai.com/v1 --model gpt-4.1-mini \
        --key-ref env:TROVE_MODEL_KEY_OPENAI
    manage.py endpoint add lab-vllm --url http://10.0.0.7:8000/v1 --model qwen3-8b --allow-private-network \
        --token-capture vllm --policy-version-from header:X-Weights-Version
    manage.py endpoint list
"""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from experience.errors import TroveError
from webapp.rollouts.endpoints import endpoint_list, endpoint_register, key_resolve
from webapp.rollouts.models import ModelEndpoint


class Command(BaseCommand):
    help = "Register a model endpoint (add) or list them (list). Jobs name an endpoint; keys stay where they are."

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        add = actions.add_parser("add", help="register an endpoint")
        add.add_argument("name")
        add.add_argument("--url", required=True, help="the base URL, e.g. https://api.openai.com/v1")
        add.add_argument("--protocol", default=ModelEndpoint.Protocol.CHAT, choices=ModelEndpoint.Protocol.values)
        add.add_argument("--model", action="append", required=True, dest="models",
                         help="a model jobs may name (repeat for more; the first is the default)")
        add.add_argument("--key-ref", default="", help="env:TROVE_MODEL_KEY_... or file:NAME (never the key)")
        add.add_argument("--allow-private-network", action="store_true",
                         help="allow loopback, link-local and private addresses (a server on this host or network)")
        add.add_argument("--token-capture", default=ModelEndpoint.TokenCapture.OFF,
                         choices=ModelEndpoint.TokenCapture.values,
                         help="ask the server for token ids and logprobs in its own fields (RL samples)")
        add.add_argument("--policy-version-from", default="",
                         help="header:NAME or body:metadata.weight_version: where the server names its weights")
        add.add_argument("--description", default="")
        actions.add_parser("list", help="list the endpoints")

    def handle(self, *args, **options):
        if options["action"] == "add":
            self._add(options)
        else:
            self._list()

    def _add(self, options) -> None:
        try:
            endpoint = endpoint_register(
                name=options["name"], base_url=options["url"], protocol=options["protocol"],
                model_names=options["models"], key_ref=options["key_ref"], description=options["description"],
                allow_private_network=options["allow_private_network"], token_capture=options["token_capture"],
                policy_version_from=options["policy_version_from"])
        except TroveError as error:
            raise CommandError(error.message) from None
        self.stdout.write(self.style.SUCCESS(f"Registered endpoint {endpoint.name!r}: {endpoint.base_url} "
                                             f"({endpoint.protocol}; models {', '.join(endpoint.model_names)})"))
        warning = _key_warning(endpoint)
        if warning:
            self.stderr.write(self.style.WARNING(warning))

    def _list(self) -> None:
        for endpoint in endpoint_list():
            private = "private network allowed" if endpoint.allow_private_network else "public addresses only"
            key = endpoint.key_ref or "no key"
            state = _key_warning(endpoint) or ("key readable" if endpoint.key_ref else "")
            self.stdout.write(f"{endpoint.name}\t{endpoint.protocol}\t{endpoint.base_url}\t"
                              f"{','.join(endpoint.model_names)}\t{key}\t{private}\t{state}".rstrip())


def _key_warning(endpoint: ModelEndpoint) -> str:
    """Why the endpoint's key cannot be read now ('' when it can, or there is none). Never the key."""
    try:
        key_resolve(endpoint.key_ref)
    except TroveError as error:
        return f"{endpoint.name}: {error.message}"
    return ""
