"""A view that saves an order and queues its receipt in one transaction."""

from __future__ import annotations

from django.db import connection, transaction
from django.http import HttpRequest, HttpResponse

from django_site.shop.tasks import send_email


def place_order(request: HttpRequest, order_id: int) -> HttpResponse:
    """Record the order and queue the email; `?fail=1` rolls both back."""
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY)")
                cursor.execute("INSERT INTO orders (id) VALUES (%s)", [order_id])
            result = send_email.enqueue(
                ["customer@example.com"], f"order {order_id}", "thanks", "shop@example.com"
            )
            if request.GET.get("fail"):
                raise RuntimeError("the order failed")
    except RuntimeError:
        return HttpResponse("rolled back", status=500)
    return HttpResponse(result.id)
