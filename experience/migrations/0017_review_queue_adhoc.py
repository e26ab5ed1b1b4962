"""ReviewQueue.adhoc: the one standing pairs queue behind the ad-hoc pairs page (/pairs/), whose items are the
pairs that page offered, so curators there share the review queues' claims (experience.services.pair_claims)."""

from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('experience', '0016_digest_data_external'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.AddField(
            model_name='reviewqueue',
            name='adhoc',
            field=models.BooleanField(default=False),
        ),
        migrations.AddConstraint(
            model_name='reviewqueue',
            constraint=models.UniqueConstraint(condition=models.Q(('adhoc', True)), fields=('kind',), name='review_queue_one_adhoc_per_kind'),
        ),
    ]
