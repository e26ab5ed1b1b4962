"""`manage.py api_token create|list|revoke`: scoped API tokens for programs."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from webapp.access.models import ApiToken
from webapp.access.scopes import SCOPES, UnknownScope, role_scopes, user_has_scope
from webapp.access.tokens import token_issue, token_revoke


class Command(BaseCommand):
    help = "Issue, list and revoke scoped API tokens (`Authorization: Bearer trv_…`)."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="issue a token; its key is printed once")
        create.add_argument("username")
        create.add_argument("--name", required=True)
        create.add_argument("--scope", action="append", default=[], help=f"one of: {', '.join(SCOPES)}")
        create.add_argument("--role", help="add a role's preset scopes: trainer, researcher, curator, ops")
        create.add_argument("--expires-in-days", type=int)
        listing = sub.add_parser("list", help="tokens (never their keys)")
        listing.add_argument("--username")
        revoke = sub.add_parser("revoke", help="revoke by prefix (the part after trv_)")
        revoke.add_argument("prefix")

    def handle(self, *args, **options):
        getattr(self, f"_{options['action']}")(options)

    def _create(self, options):
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            name = options["username"]
            raise CommandError(
                f"no user named {name!r}: a token acts for a user, so make one first, e.g. "
                f"`.venv/bin/python manage.py createsuperuser --username {name}` (an admin) or add the user in "
                f"the admin (/admin/auth/user/add/) and put them in a role group (ops, researcher, curator, trainer)")
        days = options["expires_in_days"]
        if days is not None and days < 1:
            raise CommandError("--expires-in-days: must be 1 or more")
        try:
            scopes = options["scope"] + (role_scopes(options["role"]) if options["role"] else [])
            issued = token_issue(user=user, name=options["name"], scopes=scopes,
                                 expires_at=timezone.now() + timedelta(days=days) if days else None)
        except (UnknownScope, ValueError) as problem:
            raise CommandError(str(problem)) from None
        self.stderr.write(f"token {issued.token.name!r} for {user.username}: {', '.join(issued.token.scopes)}")
        idle = [scope for scope in issued.token.scopes if not user_has_scope(user, scope)]
        if idle:  # a token never does more than its user: say so now rather than with a 403 later
            self.stderr.write(f"warning: {user.username} does not hold {', '.join(idle)} (no role grants it), "
                              "so the token cannot use it until they do")
        self.stderr.write("the key follows; it is shown this once:")
        self.stdout.write(issued.key)

    def _list(self, options):
        tokens = ApiToken.objects.select_related("user")
        if options["username"]:
            tokens = tokens.filter(user__username=options["username"])
        for token in tokens:
            state = "revoked" if token.revoked_at else ("expired" if token.expires_at and token.expires_at <= timezone.now() else "live")
            self.stdout.write(f"trv_{token.prefix}_…  {token.user.username:<16} {state:<8} {token.name}  "
                              f"[{', '.join(token.scopes)}]  last used {token.last_used_at or 'never'}")

    def _revoke(self, options):
        prefix = options["prefix"].removeprefix("trv_").split("_")[0]
        token = ApiToken.objects.filter(prefix=prefix).first()
        if token is None:
            raise CommandError(f"no token with prefix {prefix!r}")
        token_revoke(token=token)
        self.stdout.write(f"revoked {token.name!r}")
