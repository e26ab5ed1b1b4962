"""REST API: trajectories. Views are thin: input serializer -> service -> output serializer."""

from __future__ import annotations

urlpatterns: list = []
