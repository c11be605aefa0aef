"""A view that writes and enqueues in one transaction: the task exists iff the tenant's
request committed."""

from django.db import transaction
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from tenants.models import Tenant
from tenants.tasks import record


@csrf_exempt
def record_view(request: HttpRequest, slug: str) -> JsonResponse:
    label = request.POST["label"]
    with transaction.atomic():
        tenant = Tenant.objects.get(slug=slug)
        result = record.enqueue(tenant.slug, label)
    return JsonResponse({"id": result.id, "status": result.status})
