"""kvmem's Alembic migrations, installed as the `kvmem.migrations` package."""
