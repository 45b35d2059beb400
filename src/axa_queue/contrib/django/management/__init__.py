"""Django management commands of `axa_queue.contrib.django`."""
