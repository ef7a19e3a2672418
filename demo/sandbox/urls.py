from __future__ import annotations

from django.urls import path

from demo.sandbox import views

urlpatterns = [
    path("faults/", views.faults, name="sandbox-faults"),
    path("<slug:system>/effects/", views.effects, name="sandbox-effects"),
    path("<slug:system>/effects/<str:key>", views.effect_detail, name="sandbox-effect"),
    path("<slug:system>/records/<str:record_id>", views.record, name="sandbox-record"),
]
