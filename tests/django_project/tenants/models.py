from django.db import models


class Tenant(models.Model):
    """A customer of the project: rota's groups come from this model (the view
    rota_migrate makes: slug is the group id, plan and active are rota's)."""

    slug = models.SlugField(unique=True)
    plan = models.CharField(max_length=20, null=True)
    active = models.BooleanField(default=True)


class Ran(models.Model):
    """One task execution, in the order they ran (id)."""

    tenant = models.CharField(max_length=50)
    label = models.CharField(max_length=200)
