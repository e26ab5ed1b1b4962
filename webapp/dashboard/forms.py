"""What the dashboard's forms share."""

from django import forms


def form_errors(form: forms.Form) -> str:
    """A form's errors as one line for a flash message: `field: problem; field: problem`."""
    return "; ".join(f"{field}: {' '.join(str(e) for e in errors)}" for field, errors in form.errors.items())
