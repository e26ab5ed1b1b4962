"""Tokens in the admin: list, issue (the key is shown once, in the confirmation message), revoke."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages

from webapp.access.models import ApiToken
from webapp.access.scopes import ROLES, SCOPES
from webapp.access.tokens import token_issue, token_revoke


class IssueTokenForm(forms.ModelForm):
    scopes = forms.MultipleChoiceField(choices=[(s, f"{s} — {d}") for s, d in SCOPES.items()],
                                       widget=forms.CheckboxSelectMultiple, required=False)
    role = forms.ChoiceField(choices=[("", "—")] + [(r, r) for r in ROLES], required=False,
                             help_text="adds the role's preset scopes")

    class Meta:
        model = ApiToken
        fields = ["user", "name", "expires_at"]

    def clean(self):
        data = super().clean()
        if not data.get("scopes") and not data.get("role"):
            raise forms.ValidationError("choose at least one scope or a role")
        return data


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ["name", "user", "prefix", "scopes", "created_at", "expires_at", "last_used_at", "revoked_at"]
    list_filter = ["revoked_at"]
    search_fields = ["name", "prefix", "user__username"]
    actions = ["revoke"]
    form = IssueTokenForm

    def get_readonly_fields(self, request, obj=None):
        # An issued token changes only by revocation.
        return [f.name for f in ApiToken._meta.fields] if obj else []

    def get_form(self, request, obj=None, **kwargs):
        if obj is not None:
            kwargs["form"] = forms.ModelForm
            kwargs["fields"] = []
        return super().get_form(request, obj, **kwargs)

    def save_model(self, request, obj, form, change):
        if change:
            return
        data = form.cleaned_data
        scopes = list(data.get("scopes") or []) + list(ROLES.get(data.get("role") or "", ()))
        issued = token_issue(user=data["user"], name=data["name"], scopes=scopes, expires_at=data.get("expires_at"))
        # The admin goes on with `obj` (its log entry, the redirect): make it the issued row.
        obj.pk = issued.token.pk
        obj.refresh_from_db()
        messages.warning(request, f"The key of {issued.token.name!r}, shown this once: {issued.key}")

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request, queryset):
        for token in queryset:
            token_revoke(token=token)
        self.message_user(request, f"revoked {queryset.count()} token(s)")
