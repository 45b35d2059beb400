"""Place an order: the order and its receipt's task commit together, or not at all."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from shop.models import Order
from shop.tasks import send_receipt


@csrf_exempt
@require_POST
def place_order(request: HttpRequest) -> HttpResponse:
    """Save the order and queue its receipt; the task is queued when the transaction
    commits (ENQUEUE_ON_COMMIT, the default), so a rolled-back order sends nothing."""
    with transaction.atomic():
        order = Order.objects.create(
            email=request.POST["email"], total_cents=int(request.POST["total_cents"])
        )
        result = send_receipt.enqueue(order.id)
    return JsonResponse({"order": order.id, "receipt": result.id}, status=201)


def receipt(request: HttpRequest, result_id: str) -> HttpResponse:
    """How the receipt's task is doing."""
    result = send_receipt.get_result(result_id)
    body = {"status": str(result.status)}
    if result.is_finished and not result.errors:
        body["sent_to"] = result.return_value
    return JsonResponse(body)
