"""The shop's tasks, declared with Django's own `@task`: `manage.py axa_queue worker`
runs them, with no other registration."""

from __future__ import annotations

try:
    from django.tasks import task  # Django 6
except ImportError:  # Django 5.2, with the django-tasks backport
    from django_tasks import task

from shop.models import Order


@task(priority=10)
def send_receipt(order_id: int) -> str:
    """Send an order's receipt (here: mark it sent) and say to whom."""
    order = Order.objects.get(pk=order_id)
    order.receipt_sent = True
    order.save(update_fields=["receipt_sent"])
    return order.email
