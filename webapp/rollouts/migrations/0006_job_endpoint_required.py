"""A job's endpoint is required; its URL and key reference columns go (0005 moved them to endpoints).

Apart from 0005 so that Postgres alters the table in a transaction of its own, not the one that wrote it.
"""

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('rollouts', '0005_model_endpoints'),
    ]

    operations = [
        migrations.AlterField(
            model_name='rolloutjob',
            name='endpoint',
            field=models.ForeignKey(on_delete=django.db.models.deletion.PROTECT, related_name='jobs', to='rollouts.modelendpoint'),
        ),
        migrations.AlterField(
            model_name='rolloutjob',
            name='model_name',
            field=models.CharField(help_text="one of the endpoint's model_names", max_length=200),
        ),
        migrations.RemoveField(
            model_name='rolloutjob',
            name='api_key_ref',
        ),
        migrations.RemoveField(
            model_name='rolloutjob',
            name='model_base_url',
        ),
    ]
