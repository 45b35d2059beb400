"""A small Django project whose tasks run on axa-queue."""
