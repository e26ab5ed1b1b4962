"""The admin says "trajectories", not "trajectorys" (options only, no schema change)."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('experience', '0003_list_filter_indexes'),
    ]

    operations = [
        migrations.AlterModelOptions(
            name='trajectory',
            options={'ordering': ['-id'], 'verbose_name_plural': 'trajectories'},
        ),
    ]
