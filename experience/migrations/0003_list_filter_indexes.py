"""Indexes for the admin list filters on source_format and on curation events by action."""

from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('experience', '0002_search_and_list_indexes'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddIndex(
            model_name='curationevent',
            index=models.Index(fields=['action'], name='curationevent_action_idx'),
        ),
        migrations.AddIndex(
            model_name='trajectory',
            index=models.Index(fields=['source_format'], name='trajectory_format_idx'),
        ),
    ]
