"""Run by Django's own test runner (`manage.py test tenants`, from
tests/django_project/test_django_backend.py), not by pytest: the test database Django
creates gets rota's schema from `migrate` (post_migrate), so tasks enqueue in tests."""

from django.tasks import TaskResultStatus
from django.test import TestCase

from .models import Tenant
from .tasks import record


class RotaInTheTestDatabase(TestCase):
    def test_a_task_enqueues_and_reads_back(self) -> None:
        Tenant.objects.create(slug="in-test", plan="pro")
        result = record.enqueue("in-test", "from manage.py test")
        found = record.get_result(result.id)
        self.assertEqual((found.status, found.args), (
            TaskResultStatus.READY, ["in-test", "from manage.py test"]))
