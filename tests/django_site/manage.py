#!/usr/bin/env python
"""The tests' Django project's manage.py."""

import os
import sys

if __name__ == "__main__":
    # The project's package is this directory: its parent goes on the path.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_site.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)
