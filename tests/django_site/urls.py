"""The tests' URLs: the admin and the shop's view that queues a task."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from django_site.shop import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders/<int:order_id>/", views.place_order),
]
