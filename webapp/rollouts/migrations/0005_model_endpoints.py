"""Model endpoints: jobs name a registered endpoint instead of carrying a URL and a key reference.

Existing jobs keep their history: each distinct base URL they used becomes a `legacy-...` endpoint, with the
model names used there. The jobs' key references are not carried over: they were whatever the submitter
wrote (`env:SECRET_KEY` was possible), so a legacy endpoint has no key and private addresses refused until an
admin reviews it. Rollout tokens are replaced by their SHA-256 (a running rollout's harness keeps working:
the proxy hashes what it is sent).
"""

import hashlib
from urllib.parse import urlsplit

import django.db.models.deletion
from django.conf import settings
from django.db import migrations, models
from django.utils.text import slugify

LEGACY_NOTE = ("Registered by migration rollouts.0005 for jobs made before endpoints existed. The jobs' key "
               "reference was not carried over: set key_ref (from the allow-list) and allow_private_network "
               "after review.")


def _legacy_name(url, taken):
    parts = urlsplit(url)
    host = (parts.hostname or "endpoint").replace(".", "-")
    base = slugify(f"legacy-{host}-{parts.port or ''}".rstrip("-"))[:90] or "legacy"
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}-{n}"
    taken.add(name)
    return name


def register_legacy_endpoints(apps, schema_editor):
    RolloutJob = apps.get_model("rollouts", "RolloutJob")
    ModelEndpoint = apps.get_model("rollouts", "ModelEndpoint")
    taken = set(ModelEndpoint.objects.values_list("name", flat=True))
    urls = RolloutJob.objects.order_by().values_list("model_base_url", flat=True).distinct()
    for url in sorted(set(urls)):
        jobs = RolloutJob.objects.filter(model_base_url=url)
        names = sorted(set(jobs.values_list("model_name", flat=True)))
        endpoint = ModelEndpoint.objects.create(name=_legacy_name(url, taken), base_url=url, protocol="chat",
                                                model_names=names, description=LEGACY_NOTE)
        jobs.update(endpoint=endpoint)


def hash_rollout_tokens(apps, schema_editor):
    Rollout = apps.get_model("rollouts", "Rollout")
    for pk, token in Rollout.objects.values_list("pk", "token").iterator():
        Rollout.objects.filter(pk=pk).update(token=hashlib.sha256(token.encode()).hexdigest())


class Migration(migrations.Migration):

    dependencies = [
        ('rollouts', '0004_task_protected_paths_eval_files'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='ModelEndpoint',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.SlugField(max_length=100, unique=True)),
                ('base_url', models.CharField(help_text='e.g. http://vllm.internal:8000/v1 (with /v1 for chat)', max_length=500)),
                ('protocol', models.CharField(choices=[('chat', 'OpenAI Chat Completions'), ('responses', 'OpenAI Responses'), ('messages', 'Anthropic Messages'), ('gemini', 'Gemini API')], default='chat', max_length=16)),
                ('model_names', models.JSONField(default=list, help_text='the models a job may name here; the first is the default')),
                ('key_ref', models.CharField(blank=True, help_text='env:TROVE_MODEL_KEY_... or file:NAME in the secrets directory; never the key', max_length=200)),
                ('allow_private_network', models.BooleanField(default=False)),
                ('description', models.TextField(blank=True)),
                ('created_at', models.DateTimeField(auto_now_add=True)),
                ('created_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='+', to=settings.AUTH_USER_MODEL)),
            ],
            options={
                'ordering': ['name'],
            },
        ),
        migrations.AddField(
            model_name='rolloutjob',
            name='endpoint',
            field=models.ForeignKey(null=True, on_delete=django.db.models.deletion.PROTECT, related_name='jobs', to='rollouts.modelendpoint'),
        ),
        migrations.RunPython(register_legacy_endpoints, migrations.RunPython.noop),
        migrations.RunPython(hash_rollout_tokens, migrations.RunPython.noop),
    ]
