"""The admin, and the shop's order form."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from shop import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders/", views.place_order),
    path("orders/receipts/<str:result_id>/", views.receipt),
]
