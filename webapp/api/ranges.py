"""The ranges of the database columns that integer input lands in, for serializers' and forms' min/max.

Postgres' own ranges, used on SQLite too so both ways to run accept the same input. A value past them used to
reach the database and come back as a 500 (`integer out of range`); with these bounds it is a 400 naming the
field. tests/webapp/api/test_input_ranges.py fails when an integer input of the API has no bounds.
"""

INT_MAX = 2**31 - 1  # integer: models.IntegerField, PositiveIntegerField
ID_MAX = 2**63 - 1  # bigint: ids (BigAutoField), PositiveBigIntegerField
CPU_MAX = 1024.0  # CPUs per sandbox: more than any host has, and a float that cgroup arithmetic survives
